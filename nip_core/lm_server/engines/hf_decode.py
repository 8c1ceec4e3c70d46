"""The transformers engine's decode loop: one running batch that sequences join and leave
between decode steps (continuous batching), on a `DynamicCache` with left padding.

`prefill` runs newly admitted prompts (each distinct prompt once, its cache copied to every
sequence that samples from it) and `merge` joins them to the running batch, padding the shorter
cache on the left; `decode` feeds every sequence's last token once; `keep` drops finished
sequences and the padding columns nobody needs any more. Positions follow `generate`'s rule for
left padding (real tokens counted from 0), so a sequence's logits do not depend on how much
padding its batch gives it. Sampling (`hf_noise.next_tokens`) is per row: temperature, top-p,
repetition penalty and seed are tensors with one value per sequence.

transformers' own continuous batching (`generate_batch`, 5.x) samples with `torch.multinomial`
from one global generator, which cannot give a sequence the same tokens whatever shares its
batch; that is the part written here by hand.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import nip_core.lm_server.engines.hf_noise as hf_noise
from nip_core.lm_server.engines.hf_batching import Job, sequence_settings

if TYPE_CHECKING:
    import torch

COMPACT_SHARE = 1 / 8
ROW_TENSORS = ("seed_low", "seed_high", "step", "temperature", "top_p", "penalty", "length", "last")


@dataclass
class Sequence:
    """Host-side record of one generated sequence: whose it is and what it has produced."""

    owner: Any  # the engine's job, with the sample index below
    sample: int
    max_new: int
    temperature: float
    top_p: float
    penalty: float
    tokens: list[int] = field(default_factory=list)
    done: bool = False  # answered; its row stays until the batch is compacted


@dataclass
class Batch:
    """Sequences decoding together. `mask` and `history` ([B, T]) cover the cache's columns;
    `rows` holds one [B] tensor per name in ROW_TENSORS (`length`: real tokens in the cache,
    the next position; `last`: the sampled token not yet fed; `step`: tokens sampled)."""

    cache: Any
    mask: torch.Tensor
    history: torch.Tensor
    rows: dict[str, torch.Tensor]
    sequences: list[Sequence]

    @property
    def size(self) -> int:
        return len(self.sequences)

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    def remaining(self) -> int:
        """The most new tokens any sequence may still sample."""
        return max((s.max_new - len(s.tokens) for s in self.sequences if not s.done), default=0)

    def live(self) -> list[int]:
        return [i for i, s in enumerate(self.sequences) if not s.done]


def cache_keyword(model) -> str:
    """The name the model's forward gives its cache (`cache` from transformers 5.24 on)."""
    forward = getattr(model, "get_base_model", lambda: model)().forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def plain_layers(cache) -> bool:
    """Whether every cache layer holds whole [B, heads, T, dim] keys and values (no sliding
    window), so caches can be padded, joined and trimmed along T."""
    return all(type(layer).__name__ == "DynamicLayer" for layer in cache.layers)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    positions = mask.long().cumsum(-1) - 1
    return positions.masked_fill_(mask == 0, 1)


def prefill(model, prompts: list[list[int]], rows: list[int], pad_id: int, device) -> tuple:
    """(cache, mask, history, last logits) of the sequences `rows` (indices into `prompts`):
    every distinct prompt runs through the model once, left padded."""
    import torch
    from transformers import DynamicCache

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt)
        mask[i, width - len(prompt) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    cache = DynamicCache()
    output = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=_positions(mask),
        use_cache=True,
        logits_to_keep=1,
        **{cache_keyword(model): cache},
    )
    index = torch.tensor(rows, device=device)
    if rows != list(range(len(prompts))):
        cache.batch_select_indices(index)
    return cache, mask[index], ids[index], output.logits[index, -1]


def decode(model, batch: Batch) -> torch.Tensor:
    """Feed every sequence's last token; the logits of the next ([B, V])."""
    import torch

    last = batch.rows["last"][:, None]
    mask = torch.cat([batch.mask, torch.ones_like(last)], dim=1)
    output = model(
        input_ids=last,
        attention_mask=mask,
        position_ids=batch.rows["length"][:, None],
        use_cache=True,
        **{cache_keyword(model): batch.cache},
    )
    batch.mask = mask
    batch.history = torch.cat([batch.history, last], dim=1)
    batch.rows["length"] = batch.rows["length"] + 1
    return output.logits[:, -1]


def sample(batch: Batch, logits: torch.Tensor) -> list[int]:
    """Each sequence's next token (stored as its `last`, its step counted); the tokens."""
    rows, sequences = batch.rows, batch.sequences
    scores = logits.float()
    # Flags from the host-side records: asking the device would wait for it at every step.
    if any(s.penalty != 1.0 for s in sequences):
        scores = hf_noise.penalised(scores, rows["penalty"], batch.history, batch.mask)
    keys = hf_noise.row_keys(rows["seed_low"], rows["seed_high"], rows["step"])
    tokens = hf_noise.next_tokens(
        scores,
        keys,
        rows["temperature"],
        rows["top_p"],
        greedy=all(s.temperature <= 0 for s in sequences),
        nucleus=any(s.top_p < 1.0 and s.temperature > 0 for s in sequences),
    )
    rows["last"] = tokens
    rows["step"] = rows["step"] + 1
    return tokens.tolist()


def _pad_left(tensor: torch.Tensor, width: int, dim: int, value: int = 0) -> torch.Tensor:
    import torch

    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_full(shape, value), tensor], dim=dim)


def merge(first: Batch | None, second: Batch, pad_id: int) -> Batch:
    """One batch of both (first's sequences first), the narrower padded on the left."""
    import torch

    if first is None or first.size == 0:
        return second
    if second.size == 0:
        return first
    if not (plain_layers(first.cache) and plain_layers(second.cache)):
        raise ValueError("this model's cache cannot be joined along its length")
    width = max(first.width, second.width)
    for mine, theirs in zip(first.cache.layers, second.cache.layers, strict=True):
        mine.keys = torch.cat([_pad_left(mine.keys, width, 2), _pad_left(theirs.keys, width, 2)])
        mine.values = torch.cat(
            [_pad_left(mine.values, width, 2), _pad_left(theirs.values, width, 2)]
        )
    return Batch(
        cache=first.cache,
        mask=torch.cat([_pad_left(first.mask, width, 1), _pad_left(second.mask, width, 1)]),
        history=torch.cat(
            [
                _pad_left(first.history, width, 1, pad_id),
                _pad_left(second.history, width, 1, pad_id),
            ]
        ),
        rows={name: torch.cat([first.rows[name], second.rows[name]]) for name in ROW_TENSORS},
        sequences=first.sequences + second.sequences,
    )


def keep(batch: Batch, indices: list[int]) -> Batch:
    """The batch of the sequences `indices` only, without the columns left of everyone's first
    real token (plain caches; a sliding-window cache keeps its columns)."""
    import torch

    if len(indices) == batch.size:
        return batch
    index = torch.tensor(indices, dtype=torch.long, device=batch.mask.device)
    batch.cache.batch_select_indices(index)
    mask, history = batch.mask[index], batch.history[index]
    start = int(mask.any(0).long().argmax()) if indices and plain_layers(batch.cache) else 0
    if start:
        for layer in batch.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
        mask, history = mask[:, start:], history[:, start:]
    return Batch(
        cache=batch.cache,
        mask=mask,
        history=history,
        rows={name: tensor[index] for name, tensor in batch.rows.items()},
        sequences=[batch.sequences[i] for i in indices],
    )


def row_tensors(settings: list[tuple[int, float, float, float]], device) -> dict:
    """The sampling tensors of new sequences from (seed, temperature, top_p, penalty) each."""
    import torch

    seeds, temperature, top_p, penalty = zip(*settings, strict=True)
    low, high = hf_noise.seed_words(list(seeds), device)
    floats = {"temperature": temperature, "top_p": top_p, "penalty": penalty}
    rows = {name: torch.tensor(v, dtype=torch.float32, device=device) for name, v in floats.items()}
    zeros = torch.zeros(len(seeds), dtype=torch.long, device=device)
    return rows | {"seed_low": low, "seed_high": high, "step": zeros}


def start(model, jobs: list[Job], pad_id: int, device) -> tuple[Batch, torch.Tensor]:
    """The jobs' sequences, prefilled (each distinct prompt once), and their first logits."""
    distinct: dict[tuple[int, ...], int] = {}
    rows, settings, sequences = [], [], []
    for job in jobs:
        prompt = distinct.setdefault(tuple(job.prompt), len(distinct))
        for sample, setting in enumerate(sequence_settings(job)):
            rows.append(prompt)
            settings.append(setting)
            sequences.append(Sequence(job, sample, job.max_new, *setting[1:]))
    prompts = [list(p) for p in distinct]
    cache, mask, history, logits = prefill(model, prompts, rows, pad_id, device)
    tensors = row_tensors(settings, device) | {"length": mask.sum(1)}
    return Batch(cache, mask, history, tensors, sequences), logits


def retire(
    batch: Batch,
    tokens: list[int],
    stops: set[int],
    answer: Callable[[list[int]], Any],
    share: float = COMPACT_SHARE,
) -> tuple[Batch, list[tuple[Any, int, Any]]]:
    """Append each live sequence's new token; the batch, compacted (`compact`) once enough
    have ended (a stop token, or their `max_new` tokens reached), and (owner, sample,
    answer(tokens)) of each sequence that ended now."""
    finished = []
    for sequence, token in zip(batch.sequences, tokens, strict=True):
        if sequence.done:
            continue
        sequence.tokens.append(token)
        if token in stops or len(sequence.tokens) >= sequence.max_new:
            sequence.done = True
            finished.append((sequence.owner, sequence.sample, answer(sequence.tokens)))
    return compact(batch, share), finished


def compact(batch: Batch, share: float = COMPACT_SHARE) -> Batch:
    """The batch without its answered rows once they are at least `share` of it (0: any).

    Dropping rows copies the whole cache, as much as a decode step's own append does, so a
    batch whose rows end one by one carries a few answered rows (decoded, ignored) rather
    than copying its cache at every step."""
    live = batch.live()
    ended = batch.size - len(live)
    if ended and (not live or ended >= share * batch.size):
        return keep(batch, live)
    return batch
