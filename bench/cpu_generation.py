"""Benchmark: CPU tokens/s of our server through its HTTP API relative to raw `generate`, or of
one engine relative to another.

    python bench/cpu_generation.py [--requests 64] [--n 1] [--max-tokens 48]
    python bench/cpu_generation.py --engines vllm,transformers [--fine-tuned]
    python bench/cpu_generation.py \
        --engines "vllm:--vllm-cpu-dtype float32,vllm:--vllm-cpu-dtype bfloat16"

Both sides generate for the same verifier-style prompts (a HumanEval question, a solution and
an instruction to judge it, from the shipped dataset), sampling at temperature 1 with
`--max-tokens` new tokens, on the embedded SmolLM2-135M-Instruct in fp32:
- raw: one `model.generate` call over all prompts (batch = requests x n, left padding), in this
  process, after a small warm-up; tokens counted up to each sequence's end of text;
- server: `python -m nip_core.lm_server --engine transformers` as a child process, the real
  `openai` SDK sending every request at once (`--n` samples each, a seed each); tokens are the
  server's `usage.completion_tokens`.
The raw model is freed before the server starts, so both see the same machine. The last line is
`ratio server/raw tokens per second: <x>` (target >= 0.8).

With `--engines A,B` there is no raw baseline (an engine may carry server options after a
colon, so one engine can be compared with itself, e.g. vLLM's CPU dtypes): each engine's server
(one after the other, alone on the machine; vllm needs `scripts/setup_vllm.sh`) gets the same requests, after a warm-up, for
the base model and with `--fine-tuned` also for a fine-tuned one: a non-trivial LoRA adapter
(rank 8 on every linear layer, like the pipeline's, random weights, or `--adapter DIR`) loaded
through `/v1/load_lora_adapter` (a PEFT adapter on transformers, merged weights on vLLM). The
last line is `ratio A/B tokens per second: base <x>[, fine-tuned <y>]`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nip_core.lm_server.embedded_model import EMBEDDED_MODEL_NAME, embedded_model_path  # noqa: E402


def train_rows(count: int) -> pd.DataFrame:
    """The first `count` rows of the shipped dataset's train split (question, solution, label y)."""
    frame = pd.read_parquet(ROOT / "nip_core" / "data" / "humaneval_buggy.parquet")
    return frame[frame.split == "train"].head(count)


def verifier_chat(row) -> list[dict]:
    """A verifier-style chat about one dataset row: a system line, then the question, the
    solution and the instruction to judge it."""
    return [
        {"role": "system", "content": "You judge whether Python solutions are correct."},
        {
            "role": "user",
            "content": f"Question:\n{row.question}\n\nSolution:\n{row.solution}\n\n"
            "Is the solution correct? Answer 'Decision: accept' or 'Decision: reject'.",
        },
    ]


def prompts(count: int) -> list[list[dict]]:
    """`count` verifier-style chats built from the shipped dataset's train split."""
    return [verifier_chat(row) for row in train_rows(count).itertuples()]


def raw_tokens_per_second(chats: list[list[dict]], n: int, max_tokens: int) -> float:
    """Tokens/s of one `generate` call over every prompt (n samples each)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(embedded_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    texts = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats
    ]

    def run(batch: list[str]) -> tuple[int, float]:
        inputs = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False)
        torch.manual_seed(0)
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                **inputs,
                max_new_tokens=max_tokens,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                num_return_sequences=n,
                pad_token_id=tokenizer.pad_token_id,
            )
        seconds = time.perf_counter() - started
        new = out[:, inputs["input_ids"].shape[1] :].tolist()
        eos = tokenizer.eos_token_id
        tokens = sum(row.index(eos) + 1 if eos in row else len(row) for row in new)
        return tokens, seconds

    run(texts[:2])  # warm-up
    tokens, seconds = run(texts)
    print(f"raw generate: {len(texts)} prompts x n={n}: {tokens} tokens in {seconds:.1f} s")
    return tokens / seconds


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _send_all(
    url: str, chats: list[list[dict]], n: int, max_tokens: int, model: str = EMBEDDED_MODEL_NAME
) -> int:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)
    try:
        replies = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model=model,
                    messages=chat,
                    n=n,
                    max_tokens=max_tokens,
                    temperature=1.0,
                    seed=1000 + i,
                )
                for i, chat in enumerate(chats)
            )
        )
    finally:
        await client.close()
    return sum(r.usage.completion_tokens for r in replies)


def random_adapter(path: Path) -> Path:
    """A non-trivial LoRA adapter of the embedded model: rank 8 on every linear layer (as the
    pipeline trains), random A and B."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(embedded_model_path()))
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    lora = get_peft_model(model, config)
    torch.manual_seed(0)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    lora.save_pretrained(path)
    return path


def _wait_up(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=1, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.5)


def server_tokens_per_second(
    chats: list[list[dict]],
    n: int,
    max_tokens: int,
    engine: str = "transformers",
    adapter: Path | None = None,
    server_args: tuple[str, ...] = (),
) -> dict[str, float]:
    """Tokens/s through a real server process and the openai SDK, all requests at once: for the
    base model, and for `adapter` (a fine-tuned model) when given."""
    port, vllm_port = _free_port(), _free_port()
    url = f"http://127.0.0.1:{port}"
    results = {}
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
        command = [sys.executable, "-m", "nip_core.lm_server", "--engine", engine]
        command += ["--port", str(port), "--vllm-port", str(vllm_port), "--state-dir", state]
        command += list(server_args)
        proc = subprocess.Popen(command, env=env)
        name = " ".join([engine, *server_args])
        try:
            _wait_up(url, proc, 1800)
            models = {"base": EMBEDDED_MODEL_NAME}
            if adapter is not None:
                copy = Path(state) / "adapter"  # adapters must lie in the state folder
                shutil.copytree(adapter, copy)
                body = {"lora_name": "bench-ft", "lora_path": str(copy)}
                loaded = httpx.post(
                    url + "/v1/load_lora_adapter", json=body, timeout=1800, trust_env=False
                )
                loaded.raise_for_status()
                models["fine-tuned"] = "bench-ft"
            for label, model in models.items():
                asyncio.run(_send_all(url, chats[:2], 1, 4, model))  # warm-up (and switch)
                started = time.perf_counter()
                tokens = asyncio.run(_send_all(url, chats, n, max_tokens, model))
                seconds = time.perf_counter() - started
                print(
                    f"{name} server (HTTP), {label} model: {len(chats)} requests x n={n}: "
                    f"{tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tokens/s",
                    flush=True,
                )
                results[label] = tokens / seconds
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    return results


def compare_engines(args: argparse.Namespace, chats: list[list[dict]]) -> None:
    """Each engine on the same requests (base and fine-tuned model); the ratio first/second."""
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if len(engines) != 2:
        raise SystemExit("--engines takes two engines, e.g. vllm,transformers")
    with tempfile.TemporaryDirectory() as tmp:
        adapter = None
        if args.fine_tuned:
            adapter = Path(args.adapter) if args.adapter else random_adapter(Path(tmp) / "ad")
        specs = [spec.partition(":") for spec in engines]  # engine, ":", its server options
        first, second = (
            server_tokens_per_second(
                chats, args.n, args.max_tokens, engine, adapter, tuple(options.split())
            )
            for engine, _, options in specs
        )
    ratios = ", ".join(f"{label} {first[label] / second[label]:.2f}" for label in first)
    print(f"ratio {engines[0]}/{engines[1]} tokens per second: {ratios}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="server only: send each prompt this many times (an evaluation's repeated episodes)",
    )
    parser.add_argument("--server-only", action="store_true", help="skip the raw baseline")
    parser.add_argument(
        "--engines", help="compare two engines' servers instead, e.g. vllm,transformers"
    )
    parser.add_argument(
        "--fine-tuned", action="store_true", help="with --engines: a fine-tuned model too"
    )
    parser.add_argument("--adapter", help="with --fine-tuned: this LoRA adapter (default: random)")
    args = parser.parse_args(argv)
    chats = prompts(args.requests)
    if args.engines:
        compare_engines(args, chats)
        return
    if args.server_only:
        repeated = [chat for chat in chats for _ in range(args.repeat)]
        server_tokens_per_second(repeated, args.n, args.max_tokens)
        return
    raw = raw_tokens_per_second(chats, args.n, args.max_tokens)
    gc.collect()  # the raw model is gone with its function's frame
    served = server_tokens_per_second(chats, args.n, args.max_tokens)["base"]
    print(f"raw {raw:.1f} tokens/s, server {served:.1f} tokens/s")
    print(f"ratio server/raw tokens per second: {served / raw:.2f}")


if __name__ == "__main__":
    main()
