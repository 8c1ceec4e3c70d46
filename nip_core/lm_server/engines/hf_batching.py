"""Scheduling for the transformers engine: which waiting requests join the running batch, how
big a batch may grow on this device, and each sequence's sampling settings. Pure functions and
records; the engine (`hf.py`) owns the model, the worker thread and the running batch
(`hf_decode.py`).

A batch holds at most `max_sequences` sequences and `max_tokens` = sequences x (cache width +
the most new tokens any of them may still sample), which bounds the KV cache. On CPU these are
64 and 16,384 (about 0.75 GB of fp32 cache for SmolLM2-135M, and batches large enough to make
CPU generation fast); on CUDA the token budget is half the free memory after loading divided
by the model's KV bytes per token. `--hf-max-batch-sequences` / `--hf-max-batch-tokens` set them.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nip_core.lm_server.engines.base import ChatChoice, ChatRequest
from nip_core.seeding import stable_int

CPU_MAX_SEQUENCES = 64
CPU_MAX_TOKENS = 16_384
CUDA_MAX_SEQUENCES = 512  # beyond this a step's latency grows with little gain in tokens/s
CUDA_KV_SHARE = 0.5  # of the free memory; the rest is for prefill activations and logits
PREFILL_TOKENS = 32_768  # at most this many prompt tokens (padding included) per forward
# A request for another model waits for the running batch to drain; requests for the running
# model that arrived up to this long after it still join (a tree level's burst).
SWITCH_WINDOW_SECONDS = 0.5


@dataclass
class Job:
    """One chat request in flight: its prompt's tokens and the answers of its sequences."""

    request: ChatRequest
    future: asyncio.Future
    prompt: list[int]
    arrived: float
    default_max_tokens: int
    choices: list[ChatChoice | None] = field(default_factory=list)

    @property
    def greedy(self) -> bool:
        return self.request.temperature == 0

    @property
    def samples(self) -> int:
        """Sequences generated: n, or one for a greedy request (its n answers are equal)."""
        return 1 if self.greedy else self.request.n

    @property
    def max_new(self) -> int:
        return self.request.max_tokens or self.default_max_tokens

    def answers(self) -> list[ChatChoice]:
        """The request's n answers, once every sequence has finished."""
        return list(self.choices) * (self.request.n if self.greedy else 1)


@dataclass(frozen=True)
class Load:
    """The running batch's size: sequences, cache width, most new tokens still to come."""

    rows: int = 0
    width: int = 0
    remaining: int = 0


def admitted(
    jobs: Sequence[tuple[int, int, int]], load: Load, max_sequences: int, max_tokens: int
) -> int:
    """How many of `jobs` ((sequences, prompt tokens, new tokens) each, in order) join a
    batch carrying `load` within both limits. The first job that does not fit stops the rest
    (first come, first served); an empty batch always takes one, however big."""
    rows, width, remaining = load.rows, load.width, load.remaining
    count = 0
    for sequences, prompt, new in jobs:
        grown = (rows + sequences, max(width, prompt), max(remaining, new))
        over = grown[0] > max_sequences or grown[0] * (grown[1] + grown[2]) > max_tokens
        if (rows or count) and over:
            break
        rows, width, remaining = grown
        count += 1
    return count


def candidates(pending: Sequence[Job], model: str) -> list[Job]:
    """The waiting jobs that may join a batch of `model`, oldest first: those for `model` that
    arrived before (or within SWITCH_WINDOW_SECONDS of) the oldest job for another model."""
    others = [job.arrived for job in pending if job.request.model != model]
    cutoff = min(others) + SWITCH_WINDOW_SECONDS if others else float("inf")
    return [job for job in pending if job.request.model == model and job.arrived <= cutoff]


def prefill_groups(widths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive indices of `widths` (prompt tokens each) in groups whose padded size
    (members x the widest) stays within `budget`; an oversized prompt gets a group of its own."""
    groups: list[list[int]] = []
    widest = 0
    for i, width in enumerate(widths):
        if groups and (len(groups[-1]) + 1) * max(widest, width) <= budget:
            groups[-1].append(i)
            widest = max(widest, width)
        else:
            groups.append([i])
            widest = width
    return groups


async def settle(waiting: Callable[[], int], step: float = 0.01, limit: float = 0.1) -> None:
    """Wait while requests keep arriving (at most `limit` seconds) before a batch starts.

    A client sends a tree level's requests together, but the HTTP server parses them over some
    milliseconds; one prefill of all of them costs less than one per few.
    """
    waited, size = 0.0, waiting()
    while waited < limit:
        await asyncio.sleep(step)
        waited += step
        if waiting() == size:
            return
        size = waiting()


def sequence_seeds(request: ChatRequest, samples: int) -> list[int]:
    """One seed per generated sequence: from the request's seed and the sample's index, or
    fresh randomness for an unseeded request."""
    if request.seed is None:
        return [random.getrandbits(63) for _ in range(samples)]
    return [stable_int("sample", request.seed, k, bits=63) for k in range(samples)]


def sequence_settings(job: Job) -> list[tuple[int, float, float, float]]:
    """(seed, temperature, top_p, repetition penalty) of each of the job's sequences, with
    OpenAI's defaults (temperature None means 1; 0 is greedy)."""
    request = job.request
    temperature = 0.0 if job.greedy else (request.temperature or 1.0)
    top_p = request.top_p or 1.0
    penalty = request.repetition_penalty or 1.0
    seeds = sequence_seeds(request, job.samples)
    return [(seed, temperature, top_p, penalty) for seed in seeds]


def completed(finished: Sequence[tuple[Job, int, ChatChoice]]) -> list[Job]:
    """Store each finished sequence's answer in its job; the jobs whose sequences are all done."""
    done = []
    for job, sample, choice in finished:
        job.choices[sample] = choice
        if all(c is not None for c in job.choices):
            done.append(job)
    return done


def kv_bytes_per_token(config, dtype_bytes: int) -> int:
    """Bytes of keys and values one token adds to the cache, over all layers."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def device_limits(device: str, kv_bytes: int, free_bytes: int = 0) -> tuple[int, int]:
    """(max sequences, max tokens) of a batch: CPU's fixed sizes, or on CUDA a token budget of
    CUDA_KV_SHARE of the free memory."""
    if device != "cuda":
        return CPU_MAX_SEQUENCES, CPU_MAX_TOKENS
    tokens = int(free_bytes * CUDA_KV_SHARE) // max(kv_bytes, 1)
    return CUDA_MAX_SEQUENCES, max(tokens, CPU_MAX_TOKENS)


def stop_ids(tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id}
    return {i for i in ids if i is not None}


def peft_adapter_name(name: str) -> str:
    """A PEFT-safe adapter name for a served model name (PEFT rejects dots in module names).

    Served names come from run names and job suffixes, which may hold dots (`sweep-lr0.5`); the
    short hash keeps two names that differ only in replaced characters apart.
    """
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    if safe == name:
        return name
    return f"{safe}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
