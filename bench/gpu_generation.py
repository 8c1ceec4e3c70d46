"""Benchmark: tokens/s of our server's transformers engine through its HTTP API relative to raw
batched `model.generate` on the same device, at the batch sizes the pipeline uses on a GPU.

    python bench/gpu_generation.py                       # CUDA: 256 prompts x 128 tokens
    python bench/gpu_generation.py --requests 16 --max-tokens 16   # what fits a CPU run
    python bench/gpu_generation.py --server-args "--hf-max-batch-sequences 256"

Both sides generate for the same verifier-style prompts (`cpu_generation.prompts`: a HumanEval
question, a solution and an instruction to judge it), sampling at temperature 1 with
`--max-tokens` new tokens, on the embedded SmolLM2-135M-Instruct in the dtype the server picks
(bf16 on a GPU that has it, else fp16; fp32 on CPU):
- raw: one `model.generate` call over all prompts (batch = requests x n, left padding) in this
  process on the same device, after a warm-up; tokens counted up to each sequence's end of text.
  It runs on a worker thread, as the server's model does: on a loaded 2-core CPU the main
  thread's OpenMP team ran the same matmuls about 3x slower than a worker thread's;
- server: `python -m nip_core.lm_server --engine transformers` as a child process on a free
  loopback port, the real `openai` SDK sending every request at once (a seed each); tokens are
  the server's `usage.completion_tokens`.
The raw model is freed before the server starts, so both see the same device. The last line is
`ratio server/raw tokens per second: <x>` (target >= 0.7).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_generation import prompts, server_tokens_per_second  # noqa: E402

TARGET = 0.7


def _device_and_dtype():
    import torch

    if not torch.cuda.is_available():
        return "cpu", torch.float32
    return "cuda", torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def raw_tokens_per_second(chats: list[list[dict]], n: int, max_tokens: int) -> float:
    """Tokens/s of one `generate` call over every prompt (n samples each) on the device."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nip_core.lm_server.embedded_model import embedded_model_path

    device, dtype = _device_and_dtype()
    path = str(embedded_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    texts = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats
    ]

    def run(batch: list[str], new_tokens: int) -> tuple[int, float]:
        inputs = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False)
        inputs = inputs.to(device)
        torch.manual_seed(0)
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                **inputs,
                max_new_tokens=new_tokens,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                num_return_sequences=n,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, inputs["input_ids"].shape[1] :].tolist()  # waits for the device
        seconds = time.perf_counter() - started
        eos = tokenizer.eos_token_id
        return sum(row.index(eos) + 1 if eos in row else len(row) for row in new), seconds

    with ThreadPoolExecutor(max_workers=1) as worker:
        worker.submit(run, texts[:2], 4).result()  # warm-up
        tokens, seconds = worker.submit(run, texts, max_tokens).result()
    print(f"raw generate on {device}: {len(texts)} prompts x n={n}: {tokens} tokens in "
          f"{seconds:.1f} s = {tokens / seconds:.1f} tokens/s", flush=True)  # fmt: skip
    return tokens / seconds


def _free_device() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> None:
    device, _ = _device_and_dtype()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256 if device == "cuda" else 16)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=128 if device == "cuda" else 16)
    parser.add_argument("--server-args", default="", help="extra server options, one string")
    args = parser.parse_args(argv)
    base = prompts(args.requests)
    chats = [base[i % len(base)] for i in range(args.requests)]  # the split may be smaller
    raw = raw_tokens_per_second(chats, args.n, args.max_tokens)
    _free_device()
    served = server_tokens_per_second(
        chats, args.n, args.max_tokens, server_args=tuple(args.server_args.split())
    )["base"]
    print(f"raw {raw:.1f} tokens/s, server {served:.1f} tokens/s (target ratio >= {TARGET})")
    print(f"ratio server/raw tokens per second: {served / raw:.2f}")


if __name__ == "__main__":
    main()
