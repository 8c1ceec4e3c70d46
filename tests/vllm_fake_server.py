"""A fake `vllm` executable for tests/test_vllm_engine.py (copied into tmp_path as `vllm`).

Usage as vLLM's: `vllm serve MODEL --host H --port P [--served-model-name NAME] ...`. Serves
/v1/models, /v1/chat/completions, /v1/load_lora_adapter and /v1/unload_lora_adapter; records
launches (argv and vLLM's environment switches) and requests in `requests.jsonl` beside itself;
starts a sleeping "worker" child (as vLLM starts its engine core). A chat answers
`<served name>#<choice index>`; scoring (`/tokenize`, then `prompt_logprobs` or
one-token `/v1/completions` with `logprob_token_ids`) gives -0.5 a word (after
a reload -1.5); after `/collective_rpc` `reload_weights` (served with
VLLM_SERVER_DEV_MODE=1, as `/reset_prefix_cache`) `<folder name of the weights>#<index>`. Env switches: FAKE_VLLM_DELAY (seconds before listening),
FAKE_VLLM_CRASH (exit 3 at start-up), FAKE_VLLM_IGNORE_TERM (ignore SIGTERM),
FAKE_VLLM_CHAT_DELAY (seconds each chat takes), FAKE_VLLM_MAX_SEQS (as vLLM's `--max-num-seqs`:
chats run while their samples fit, the rest queue; each chat records the sequences it found
received and not yet answered, `load`).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).parent
MODEL = ""
LABEL = ""  # what a chat answer starts with: the served name, or the folder of reloaded weights
ADAPTERS: dict[str, str] = {}
RUNNING = threading.Condition()
LOAD = {"received": 0, "running": 0}  # sequences, guarded by RUNNING


def record(kind, **fields):
    with (HERE / "requests.jsonl").open("a") as fh:
        fh.write(json.dumps({"kind": kind, "pid": os.getpid(), **fields}) + "\n")


def run_chat(n: int) -> None:
    """Take FAKE_VLLM_CHAT_DELAY seconds once the chat's `n` sequences fit FAKE_VLLM_MAX_SEQS."""
    limit = int(os.environ.get("FAKE_VLLM_MAX_SEQS", "0")) or None
    with RUNNING:
        LOAD["received"] += n
        record("load", sequences=LOAD["received"])
        while limit and LOAD["running"] and LOAD["running"] + n > limit:
            RUNNING.wait()
        LOAD["running"] += n
    time.sleep(float(os.environ.get("FAKE_VLLM_CHAT_DELAY", "0")))
    with RUNNING:
        LOAD["received"] -= n
        LOAD["running"] -= n
        RUNNING.notify_all()


class Handler(BaseHTTPRequestHandler):
    def send(self, code, body):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, code, message):
        self.send(code, {"error": {"message": message, "type": "Error", "code": code}})

    def do_GET(self):
        if self.path != "/v1/models":
            return self.error(404, "Not Found")
        self.send(200, {"object": "list", "data": [{"id": m} for m in [MODEL, *ADAPTERS]]})

    def do_POST(self):
        global LABEL
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        record("post", path=self.path, body=body)
        if self.path == "/tokenize":
            ids = fake_tokens(body["messages"], not body.get("continue_final_message"))
            return self.send(200, {"count": len(ids), "tokens": ids})
        if self.path == "/v1/completions":  # scoring a prefix's next tokens: -0.5 each (-1.5)
            per_token = -1.5 if LABEL else -0.5
            wanted = body["logprob_token_ids"]
            top = {f"token_id:{t}": per_token for t in [wanted[0], *wanted]}
            logprobs = {"tokens": [f"token_id:{wanted[0]}"], "top_logprobs": [top]}
            return self.send(200, {"choices": [{"text": "", "logprobs": logprobs}]})
        if self.path == "/v1/chat/completions":
            name = body["model"]
            if name != MODEL and name not in ADAPTERS:
                return self.error(404, f"The model `{name}` does not exist.")
            if body.get("prompt_logprobs") is not None:  # scoring: -0.5 a token (reloaded: -1.5)
                ids = fake_tokens(body["messages"], False)
                per_token = -1.5 if LABEL else -0.5
                logprobs = [None] + [{str(t): {"logprob": per_token}} for t in ids[1:]]
                return self.send(200, {"prompt_token_ids": ids, "prompt_logprobs": logprobs})
            if body.get("max_tokens", 1) < 1:
                return self.error(400, "max_tokens must be at least 1")
            run_chat(body.get("n", 1))
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": f"{LABEL or name}#{i}"},
                    "finish_reason": "length" if i else "stop",
                }
                for i in reversed(range(body.get("n", 1)))
            ]
            return self.send(200, {"object": "chat.completion", "choices": choices})
        if self.path in ("/collective_rpc", "/reset_prefix_cache"):
            if os.environ.get("VLLM_SERVER_DEV_MODE") != "1":
                return self.error(404, "Not Found")
            if self.path == "/collective_rpc":
                path = body["kwargs"]["weights_path"]
                if "BROKEN" in path:
                    return self.error(500, f"cannot load weights from {path}")
                LABEL = Path(path).name
                return self.send(200, {"results": [None]})
            return self.send(200, "")
        name = body.get("lora_name")
        if self.path == "/v1/load_lora_adapter":
            if name in ADAPTERS:
                return self.error(400, f"The lora adapter '{name}' has already been loaded.")
            if "corrupt" in body["lora_path"]:
                return self.error(400, "Loading lora failed: No adapter found")
            ADAPTERS[name] = body["lora_path"]
            return self.send(200, f"Success: LoRA adapter '{name}' added successfully.")
        if self.path == "/v1/unload_lora_adapter":
            if name not in ADAPTERS:
                return self.error(404, f"The lora adapter '{name}' cannot be found.")
            del ADAPTERS[name]
            return self.send(200, f"Success: LoRA adapter '{name}' removed successfully.")
        self.error(404, "Not Found")

    def log_message(self, *args):
        pass


def fake_tokens(messages: list[dict], generation_prompt: bool) -> list[int]:
    """One token per word of every message, and one for the assistant's turn before the last
    message (or at the end, with the generation prompt)."""
    words = [w for m in messages[:-1] for w in m["content"].split()]
    if generation_prompt:
        words += messages[-1]["content"].split() + ["<assistant>"]
    else:
        words += ["<assistant>"] + messages[-1]["content"].split()
    return [1000 + len(w) for w in words]


def main(args: list[str]) -> None:
    global MODEL
    MODEL, port, host = args[1], int(args[args.index("--port") + 1]), args[args.index("--host") + 1]
    if "--served-model-name" in args:
        MODEL = args[args.index("--served-model-name") + 1]
    switches = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
    record(
        "launch",
        argv=args,
        lora_env=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
        env=switches,
    )
    print(f"fake vllm: loading {MODEL}", flush=True)
    if os.environ.get("FAKE_VLLM_CRASH"):
        print("RuntimeError: CUDA out of memory (fake)", file=sys.stderr, flush=True)
        sys.exit(3)
    if os.environ.get("FAKE_VLLM_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    (HERE / f"worker-{os.getpid()}.pid").write_text(str(worker.pid))
    time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0")))
    print(f"fake vllm: serving on {host}:{port}", flush=True)
    ThreadingHTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
