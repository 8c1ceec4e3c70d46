"""The memory-bound training path returns freed blocks to the system (glibc's mmap threshold)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from nip_core.lm_server import training

# Free one 8 MiB block (glibc's default then serves blocks up to 8 MiB from the heap), then
# allocate 200 MiB in 2 MiB tensors, pin the heap's top with one more, and free the 200 MiB.
_HELD_AFTER_FREE = """
import sys, psutil, torch
from nip_core.lm_server.training import return_freed_memory
if sys.argv[1] == "fixed":
    assert return_freed_memory()
big = torch.ones(8 << 20, dtype=torch.uint8)
del big
process = psutil.Process()
before = process.memory_info().rss
blocks = [torch.ones(2 << 20, dtype=torch.uint8) for _ in range(100)]
pin = torch.ones(2 << 20, dtype=torch.uint8)
del blocks
print((process.memory_info().rss - before) / 2**20)
"""


def _held_mib(mode: str, env: dict | None = None) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _HELD_AFTER_FREE, mode],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_blocks_go_back_to_the_system_only_when_asked():
    import os
    from pathlib import Path

    # A bare environment: in the full suite a Dask nanny (the dask task runner's tests) had put
    # MALLOC_TRIM_THRESHOLD_ in the worker's environment, and any MALLOC_*_ variable turns glibc's
    # dynamic threshold off, so the default too mapped the 2 MiB blocks (held 2 MiB, not 202).
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    assert _held_mib("default", env) > 150  # the heap keeps what was freed below its top
    assert _held_mib("fixed", env) < 20


def test_a_threshold_from_the_environment_wins(monkeypatch):
    monkeypatch.setenv(training.MMAP_THRESHOLD_ENV, "65536")
    assert training.return_freed_memory() is False


@pytest.mark.parametrize(("checkpointing", "cuda", "asked"), [(True, False, 1), (False, False, 0)])
def test_only_the_memory_bound_cpu_path_asks(monkeypatch, checkpointing, cuda, asked):
    calls = []
    monkeypatch.setattr(training, "return_freed_memory", lambda: calls.append(1))
    monkeypatch.setattr(training, "checkpoints_activations", lambda *a: checkpointing)
    monkeypatch.setattr(training, "has_cuda", lambda: cuda)
    monkeypatch.setattr(training, "score_only_labelled_positions", lambda: None)
    monkeypatch.setattr(training, "trainer_config", lambda *a, **k: None)
    monkeypatch.setattr(training, "SHARE_PAIR_PROMPTS", False)  # no model here to patch
    import trl

    # no LoRA dropout to swap
    trainer = SimpleNamespace(
        model=torch.nn.Linear(2, 2), args=SimpleNamespace(device=torch.device("cpu"))
    )
    monkeypatch.setattr(trl, "DPOTrainer", lambda **k: trainer)
    options = training.TrainingOptions(method="dpo")
    assert training.build_trainer(options, None, None, [], "out") is trainer
    assert len(calls) == asked
