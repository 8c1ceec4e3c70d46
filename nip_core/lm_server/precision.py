"""The precision of a training job's frozen weights, chosen by what the hardware multiplies.

bf16 where the hardware multiplies it natively (a CUDA GPU that supports it; a CPU whose flags
list AVX512_BF16, AMX or Arm's BF16), fp32 on other CPUs (where bf16 matrix products are
emulated: 1.6 GFLOP/s against fp32's 145 on a 2-core AVX2-only EPYC) and fp16 on older GPUs. The
LoRA weights, their gradients and the optimizer state stay fp32 (PEFT upcasts adapters), and
TRL's output layer sums log-probabilities in fp32. On CPU the weights themselves are bf16, not
autocast: casting fp32 weights on every product cost more than it saved there. Every job says
its choice and why in its first event (`train_job`).
"""

from __future__ import annotations

from typing import Any

from nip_core.lm_server.hardware import NATIVE_BF16_FLAGS, cpu_flags
from nip_core.lm_server.options import OptionsError, TrainingOptions


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def training_precision(options: TrainingOptions) -> tuple[str, str]:
    """(precision of the frozen weights, why): "bf16", "fp16" or "fp32" for this machine."""
    if has_cuda():
        import torch

        if options.precision == "fp32":
            return "fp32", "asked for"
        if torch.cuda.is_bf16_supported():
            return "bf16", "the GPU supports it"
        if options.precision == "bf16":
            raise OptionsError("precision 'bf16': this GPU does not support bf16", "precision")
        return "fp16", "the GPU has no bf16"
    if options.precision != "auto":
        return options.precision, "asked for"
    native = sorted(cpu_flags().intersection(NATIVE_BF16_FLAGS))
    if native:
        return "bf16", f"the CPU multiplies bf16 natively: {', '.join(native)}"
    return "fp32", "the CPU lists neither avx512_bf16, amx_bf16 nor bf16"


def torch_dtype(precision: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]


def precision_args(precision: str) -> dict[str, Any]:
    """TrainingArguments fields for this device: on CPU no autocast (the weights carry the
    precision), on CUDA TRL's mixed precision (see the module docstring)."""
    if not has_cuda():
        return {"bf16": False, "fp16": False, "use_cpu": True, "gradient_checkpointing": False}
    return {
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "gradient_checkpointing": True,
    }
