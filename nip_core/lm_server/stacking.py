"""Stack two LoRA adapters into one, so a "stacked" model is still a single servable adapter.

A stacked job trains adapter 2 on top of the weights W + s1·B1·A1 (adapter 1 merged). The sum
s1·B1·A1 + s2·B2·A2 equals B·A with A = [A1; A2] and B = [s1·B1, s2·B2], which is a LoRA of rank
r1 + r2 with scaling 1 (lora_alpha = r). Modules present in only one adapter get zero blocks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

_WEIGHTS = "adapter_model.safetensors"
_CONFIG = "adapter_config.json"


def _scaling(config: dict) -> float:
    if config.get("use_rslora"):
        raise ValueError("stacking rsLoRA adapters is not supported")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError("stacking adapters with per-module ranks is not supported")
    return config["lora_alpha"] / config["r"]


def _modules(weights: dict) -> set[str]:
    return {k.rsplit(".lora_", 1)[0] for k in weights if ".lora_A." in k or ".lora_B." in k}


def _block(weights: dict, module: str, part: str, rank: int, like):
    """The A or B weight of `module`, or a zero block of the right shape when it is absent."""
    import torch

    key = f"{module}.lora_{part}.weight"
    if key in weights:
        return weights[key].float()
    shape = (rank, like.shape[1]) if part == "A" else (like.shape[0], rank)
    return torch.zeros(shape)


def _layers_of_both(configs: list[dict]) -> list[int] | None:
    """The layers either adapter holds (None: one of them holds every layer), so a stacked
    adapter of a top-layer job (`lora_top_layers`) keeps its parent's lower layers."""
    layers = [c.get("layers_to_transform") for c in configs]
    if any(each is None for each in layers):
        return None
    return sorted({i for each in layers for i in ([each] if isinstance(each, int) else each)})


def stack_adapters(first: Path, second: Path, output: Path) -> None:
    """Write to `output` one adapter equivalent to applying `first` then `second`."""
    from safetensors.torch import load_file, save_file

    configs = [json.loads((d / _CONFIG).read_text()) for d in (first, second)]
    weights = [load_file(str(d / _WEIGHTS)) for d in (first, second)]
    scales = [_scaling(c) for c in configs]
    ranks = [c["r"] for c in configs]
    merged = {}
    for module in sorted(_modules(weights[0]) | _modules(weights[1])):
        a_like = next(
            w[f"{module}.lora_A.weight"] for w in weights if f"{module}.lora_A.weight" in w
        )
        b_like = next(
            w[f"{module}.lora_B.weight"] for w in weights if f"{module}.lora_B.weight" in w
        )
        import torch

        a = [_block(w, module, "A", r, a_like) for w, r in zip(weights, ranks, strict=True)]
        b = [
            _block(w, module, "B", r, b_like) * s
            for w, r, s in zip(weights, ranks, scales, strict=True)
        ]
        merged[f"{module}.lora_A.weight"] = torch.cat(a, dim=0).contiguous()
        merged[f"{module}.lora_B.weight"] = torch.cat(b, dim=1).contiguous()
    rank = sum(ranks)
    config = dict(configs[1], r=rank, lora_alpha=rank)
    targets = {m.rsplit(".", 1)[-1] for m in _modules(merged)}
    config["target_modules"] = sorted(targets)
    config["layers_to_transform"] = _layers_of_both(configs)
    output.mkdir(parents=True, exist_ok=True)
    save_file(merged, str(output / _WEIGHTS), metadata={"format": "pt"})
    (output / _CONFIG).write_text(json.dumps(config, indent=1))
    if second.resolve().parent == output.resolve():
        shutil.rmtree(second)
