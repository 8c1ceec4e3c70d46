"""The inspection examples of the README and docs/inspecting.md run as written on a fresh run.

They read `artifacts/exp1`, the README's `python -m flows.malt_run --set rl.num_iterations=3
--run-name exp1`; here that command runs on the offline dummy backend (two iterations, a small
batch), from a scratch folder, and every Python block that reads the run is executed unchanged,
as is `examples/inspect_run.py`.
"""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest

from flows.malt_run import main as run_main

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def inspection_blocks(path: Path) -> list[str]:
    """The Python code blocks of a document that read the example run."""
    return [b for b in BLOCK.findall(path.read_text()) if "artifacts/exp1" in b]


@pytest.fixture(scope="module")
def exp1(tmp_path_factory, prefect_harness) -> Path:
    folder = tmp_path_factory.mktemp("docs")
    args = ["--artifacts-root", str(folder / "artifacts"), "--run-name", "exp1", "--no-wandb"]
    dummy = [
        "--set",
        "agents._default.use_dummy_api=true",
        "--set",
        "rl.num_iterations=2",
        "--set",
        "rl.rollouts_per_iteration=6",
    ]
    assert run_main([*args, *dummy]) == 0
    return folder


@pytest.mark.parametrize("document", ["README.md", "docs/inspecting.md"])
def test_inspection_examples_run_as_written(exp1, document, monkeypatch):
    blocks = inspection_blocks(ROOT / document)
    assert blocks, f"{document} has no example that reads artifacts/exp1"
    monkeypatch.chdir(exp1)
    for code in blocks:
        exec(compile(code, document, "exec"), {"__name__": "__docs__"})


def test_the_inspection_script_runs_on_the_run(exp1, monkeypatch, capsys):
    monkeypatch.chdir(exp1)
    monkeypatch.setattr(sys, "argv", ["inspect_run.py", "artifacts/exp1"])
    runpy.run_path(str(ROOT / "examples" / "inspect_run.py"), run_name="__main__")
    assert "verifier" in capsys.readouterr().out
