"""Stable hashing helpers: the same inputs give the same numbers on every machine and run.

Python's built-in `hash` is salted per process, so every seed and split decision here is derived
from SHA-256 instead.
"""

from __future__ import annotations

import hashlib


def prover_stance(solution: str) -> int:
    """Parity of the SHA-256 hex digest of `solution` read as an integer (as the reference does).

    >>> prover_stance("abc") in (0, 1)
    True
    """
    return int(hashlib.sha256(solution.encode("utf-8")).hexdigest(), 16) % 2


def stable_seed(*parts: object) -> int:
    """A 64-bit seed derived from the string forms of `parts` (e.g. run seed, problem id, purpose)."""
    text = "\x1f".join(str(part) for part in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def stable_fraction(*parts: object) -> float:
    """A number in [0, 1) derived from `parts`; used for split decisions that must not move."""
    return stable_seed(*parts) / 2**64
