"""Benchmark: one decoder layer's attention, forward and backward, three ways, on this machine.

    python bench/attention_backward.py [--rows 2] [--width 437] [--repeats 20] [--precision bf16]

Issue 57's profile of the packed DPO step put a quarter of it in flash attention's backward, and
a one-off timing (341 tokens, one row, no mask) had the math kernel's backward faster than
flash's, so "a flash forward with a math-style backward" was a candidate. This times, on the
shapes a packed pair of the shipped recipe gives (SmolLM2-135M: 9 heads of 64, keys and values
repeated to 9; `--rows` packed rows of `--width` tokens under a causal boolean 4-D mask, as
`nip_core.lm_server.shared_prefix` passes it):

- `flash`: `scaled_dot_product_attention` as transformers calls it (CPU: the flash kernel);
- `math`: the same call on the math kernel;
- `flash_math`: flash's forward, and a backward that recomputes the probabilities in fp32
  and takes the four products of the textbook gradient (an autograd Function).

Each is the median of `--repeats` forward-and-backward passes; the gradients of `flash_math`
are checked against `flash`'s first. The last line is `ratio flash_math/flash: <x>`: below 1 the
idea pays on this machine.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, HEAD_DIM = 9, 64  # SmolLM2-135M-Instruct


class FlashForwardMathBackward(torch.autograd.Function):
    """Flash attention's output; its gradient from the probabilities recomputed in fp32."""

    @staticmethod
    def forward(ctx, query, key, value, mask, scale):
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
        ctx.save_for_backward(query, key, value, mask, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, mask, out = ctx.saved_tensors
        scores = torch.matmul(query, key.transpose(-1, -2)).float() * ctx.scale
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        grad_value = torch.matmul(probs.to(query.dtype).transpose(-1, -2), grad_out)
        grad_probs = torch.matmul(grad_out, value.transpose(-1, -2)).float()
        row_dot = (grad_out.float() * out.float()).sum(-1, keepdim=True)
        grad_scores = (probs * (grad_probs - row_dot) * ctx.scale).to(query.dtype)
        grad_query = torch.matmul(grad_scores, key)
        grad_key = torch.matmul(grad_scores.transpose(-1, -2), query)
        return grad_query, grad_key, grad_value, None, None


def median_ms(step, tensors, grad_out, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        for tensor in tensors:
            tensor.grad = None
        start = time.perf_counter()
        step().backward(grad_out)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--width", type=int, default=437)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    torch.manual_seed(0)
    shape = (args.rows, HEADS, args.width, HEAD_DIM)
    query, key, value = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(shape, dtype=dtype)
    mask = torch.ones(args.width, args.width, dtype=torch.bool).tril()
    mask = mask.expand(args.rows, 1, -1, -1).contiguous()
    scale = HEAD_DIM**-0.5
    tensors = (query, key, value)

    def flash():
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)

    def flash_math():
        return FlashForwardMathBackward.apply(query, key, value, mask, scale)

    grads = []
    for step in (flash, flash_math):
        for tensor in tensors:
            tensor.grad = None
        step().backward(grad_out)
        grads.append([tensor.grad.float() for tensor in tensors])
    error = max(((a - b).norm() / a.norm()).item() for a, b in zip(*grads, strict=True))
    print(f"gradients of flash_math against flash: largest relative error {error:.1e}")
    flash_ms = median_ms(flash, tensors, grad_out, args.repeats)
    with sdpa_kernel(SDPBackend.MATH):
        math_ms = median_ms(flash, tensors, grad_out, args.repeats)
    flash_math_ms = median_ms(flash_math, tensors, grad_out, args.repeats)
    print(f"{args.rows} x {args.width} tokens, {args.precision}, {torch.get_num_threads()} threads")
    print(
        f"forward+backward ms: flash {flash_ms:.2f}, math {math_ms:.2f}, flash_math {flash_math_ms:.2f}"
    )
    print(f"ratio flash_math/flash: {flash_math_ms / flash_ms:.2f}")


if __name__ == "__main__":
    main()
