"""LoRA dropout whose masks cost a fraction of torch's on CPU.

PEFT puts an `nn.Dropout` before every LoRA adapter: seven a layer in SmolLM2, each drawing a
fresh Bernoulli mask over its input (tokens x 576 or x 1536) in every forward pass. On CPU,
`bernoulli_` draws one number at a time from the generator, so one mask costs about a third of
a 576 x 576 matrix product over the same tokens, and the masks were 10-15 % of the recipe's DPO
step (`bench/dpo_roofline.py`). The same mask can be read off random bits drawn in bulk: 64-bit
words from the generator, each split into four 16-bit numbers, a position kept when its number
is at least the drop threshold. Each position is dropped independently with probability
`round(p * 65536) / 65536` (0.050003 for the recipe's 0.05) and kept ones are scaled by
1 / (1 - p), as `nn.Dropout` does; the masks cost about 40 % of what they did (3.1 -> 1.2 s
over four profiled steps) and the step keeps its regulariser. The generator is torch's, so
`torch.manual_seed` (the trainer's seed) fixes the masks as before.
"""

from __future__ import annotations

import math

import torch

_LEVELS = 1 << 16  # the values of one 16-bit slice of a random word


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device=None) -> torch.Tensor:
    """A boolean mask of `shape`, each entry False (dropped) with probability p (to 1/65536),
    independently of the others."""
    count = math.prod(shape)
    words = torch.empty((count + 3) // 4, dtype=torch.int64, device=device)
    words.random_(-(1 << 63), None)  # every bit of every word uniform
    slices = words.view(torch.int16)[:count]  # uniform over [-32768, 32767]
    threshold = -(_LEVELS // 2) + round(p * _LEVELS)
    return (slices >= threshold).view(shape)


class BulkRandomDropout(torch.nn.Dropout):
    """`nn.Dropout` (same p, scaling and train/eval behaviour) with masks from `keep_mask`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return input
        if self.p == 1:
            return input * 0
        scale = keep_mask(input.shape, self.p, input.device).to(input.dtype) / (1 - self.p)
        return input * scale  # autograd keeps `scale` for the backward pass, as dropout does


def use_bulk_random_dropout(model: torch.nn.Module) -> int:
    """Swap every LoRA dropout of `model` (PEFT's `lora_dropout` module dicts) that drops
    anything for a `BulkRandomDropout` of the same p and mode; returns how many were swapped."""
    swapped = 0
    for module in model.modules():
        dropouts = getattr(module, "lora_dropout", None)
        if not isinstance(dropouts, torch.nn.ModuleDict):
            continue
        for name, dropout in list(dropouts.items()):
            if type(dropout) is torch.nn.Dropout and dropout.p > 0:
                fast = BulkRandomDropout(dropout.p)
                fast.train(dropout.training)
                dropouts[name] = fast
                swapped += 1
    return swapped
