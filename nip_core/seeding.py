"""Stable seeds from an item's identity (never Python's per-process salted `hash`)."""

from __future__ import annotations

import hashlib


def stable_int(*parts: object, bits: int = 63) -> int:
    """A non-negative integer determined only by `parts` (their `str` forms)."""
    blob = "\x1f".join(str(p) for p in parts).encode()
    digest = hashlib.blake2b(blob, digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - bits)


def episode_seed(run_seed: int, iteration: int, batch_index: int) -> int:
    return stable_int("episode", run_seed, iteration, batch_index, bits=31)


def call_seed(run_seed: int, iteration: int, node_id: str, agent: str) -> int:
    return stable_int("call", run_seed, iteration, node_id, agent, bits=31)
