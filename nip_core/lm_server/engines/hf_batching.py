"""Batching and sampling for the transformers engine: how pending requests become `generate`
calls (groups of compatible settings, length-sorted chunks within a token budget), one prefill
per distinct prompt, and per-sequence seeded sampling. Pure functions and small classes; the
engine (`hf.py`) owns the model and the worker thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from nip_core.lm_server.engines.base import ChatRequest
from nip_core.seeding import stable_int

_Pending = tuple[ChatRequest, asyncio.Future]


def generate_with_shared_prompts(model, input_ids, attention_mask, rows, **kwargs):
    """`generate` for sequences `rows` (indices into the distinct prompts), prefilling each
    distinct prompt once.

    On a CPU the prompt (a problem and its solution, hundreds of tokens) costs far more than the
    few dozen tokens answered, and `num_return_sequences` would prefill it once per sample. Here
    every distinct prompt but its last token goes through the model once, its KV cache is
    copied to the rows that use it, and `generate` continues from there (it feeds only the
    uncached last token). Positions follow `generate`'s own rule for left padding.
    """
    import torch
    from transformers import DynamicCache

    if input_ids.shape[1] < 2 or len(rows) == input_ids.shape[0] == len(torch.unique(rows)):
        return model.generate(
            input_ids=input_ids[rows], attention_mask=attention_mask[rows], **kwargs
        )
    prefix_mask = attention_mask[:, :-1]
    positions = prefix_mask.long().cumsum(-1) - 1
    positions.masked_fill_(prefix_mask == 0, 1)
    cache = DynamicCache()
    model(
        input_ids=input_ids[:, :-1],
        attention_mask=prefix_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    cache.batch_select_indices(rows)
    return model.generate(
        input_ids=input_ids[rows],
        attention_mask=attention_mask[rows],
        past_key_values=cache,
        **kwargs,
    )


def _stop_ids(tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id}
    return {i for i in ids if i is not None}


def _sampling_kwargs(request: ChatRequest, greedy: bool, samples: int, default_max: int) -> dict:
    """`generate` arguments; OpenAI semantics: temperature None means 1, 0 means greedy."""
    kwargs: dict[str, Any] = {
        "max_new_tokens": request.max_tokens or default_max,
        "num_return_sequences": samples,
        "do_sample": not greedy,
    }
    if greedy:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(temperature=request.temperature or 1.0, top_p=request.top_p or 1.0, top_k=0)
    if request.repetition_penalty is not None:
        kwargs["repetition_penalty"] = request.repetition_penalty
    return kwargs


def _greedy_kwargs(kwargs: dict) -> dict:
    """Sampling arguments turned into greedy ones (the sampler draws through the scores)."""
    return kwargs | {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}


def sequence_seeds(requests: list[ChatRequest], samples: int) -> list[int]:
    """One seed per generated sequence: from the request's seed and the sample's index, or
    fresh randomness for an unseeded request."""
    import random

    return [
        stable_int("sample", r.seed, k, bits=63) if r.seed is not None else random.getrandbits(63)
        for r in requests
        for k in range(samples)
    ]


class SeededSampler:
    """A logits processor that samples each sequence from its own seeded random stream.

    Adding Gumbel noise to the tempered (and top-p filtered) scores and taking the argmax draws
    exactly from the softmax (the Gumbel-max trick), so with greedy decoding each sequence
    samples with a generator of its own: its answer depends on its request's seed, not on which
    other requests shared the batch. That makes seeded requests reproducible on a batching
    server, and evaluations of two models paired (same seed, same noise).
    """

    def __init__(self, seeds: list[int], *, temperature: float, top_p: float) -> None:
        import torch

        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, input_ids, scores):
        import torch

        scores = scores.float() / self.temperature
        if self.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True, dim=-1)
            mass = ordered.softmax(-1).cumsum(-1)
            drop_sorted = mass - ordered.softmax(-1) >= self.top_p  # keep the first over top_p
            scores = scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), -torch.inf)
        uniform = torch.stack(
            [torch.rand(scores.shape[-1], generator=g) for g in self.generators]
        ).to(scores.device)
        gumbel = -torch.log(-torch.log(uniform.clamp(min=1e-20, max=1.0 - 1e-7)))
        return scores + gumbel


def _groups(batch: list[_Pending]) -> list[list[_Pending]]:
    """Split a batch into groups that can share one `generate` call.

    Requests with different seeds share a call (on CPU, batching a whole tree level is what
    makes self-hosted rollouts affordable); every sequence still samples from its own seeded
    stream (`SeededSampler`), so a seeded request's answer does not depend on its batch.
    """
    groups: dict[tuple, list[_Pending]] = defaultdict(list)
    for request, future in batch:
        key = (
            request.model,
            request.n,
            request.temperature,
            request.top_p,
            request.max_tokens,
            request.repetition_penalty,
        )
        groups[key].append((request, future))
    return list(groups.values())


def _chunks(
    groups: list[list[_Pending]],
    max_sequences: int,
    max_tokens: int,
    prompt_length: Callable[[ChatRequest], int],
    default_new_tokens: int = 512,
) -> list[list[_Pending]]:
    """Pack each group, shortest prompt first, into calls within both limits.

    A call's cost is sequences x (longest prompt + new tokens) since prompts are padded to the
    longest: sorting by length keeps similar lengths together (little padding), and a request
    that alone exceeds the token budget still gets a call of its own.
    """
    chunks: list[list[_Pending]] = []
    for group in groups:
        lengths = {id(item): prompt_length(item[0]) for item in group}
        new_tokens = group[0][0].max_tokens or default_new_tokens
        current: list[_Pending] = []
        longest = 0
        for item in sorted(group, key=lambda item: lengths[id(item)]):
            request = item[0]
            sequences = sum(r.n for r, _ in current) + request.n
            width = max(longest, lengths[id(item)]) + new_tokens
            if current and (sequences > max_sequences or sequences * width > max_tokens):
                chunks.append(current)
                current, longest = [], 0
            current.append(item)
            longest = max(longest, lengths[id(item)])
        if current:
            chunks.append(current)
    return chunks


def peft_adapter_name(name: str) -> str:
    """A PEFT-safe adapter name for a served model name (PEFT rejects dots in module names).

    Served names come from run names and job suffixes, which may hold dots (`sweep-lr0.5`); the
    short hash keeps two names that differ only in replaced characters apart.
    """
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    if safe == name:
        return name
    return f"{safe}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
