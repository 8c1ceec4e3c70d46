"""What the CPU can do, read from /proc/cpuinfo: shared by serving (vLLM's dtype on CPU) and
training (the precision of a job's frozen weights)."""

from __future__ import annotations

import os
from pathlib import Path

# /proc/cpuinfo flags of CPUs that compute bf16 natively (x86 AVX-512 BF16 or AMX, Arm's BF16).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's feature flags (x86 `flags`, Arm `Features`); empty if unreadable."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()
