"""Every invocation of a run or an experiment records where its results came from."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from flows.malt_iteration import main as iteration_main
from nip_core.run import provenance
from nip_core.run.artifacts import RunPaths

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 sha_ni
processor\t: 1
model name\t: AMD EPYC 9B14
"""


def test_cpu_description_keeps_the_model_and_the_flags_that_change_speed():
    described = provenance.cpu_description(CPUINFO)
    assert described == {
        "cpu": "AMD EPYC 9B14",
        "cpu_flags": ["avx2", "fma", "avx512f", "avx512_bf16"],
    }


def test_git_state_names_the_commit_and_a_dirty_tree(tmp_path: Path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "x")
    (tmp_path / "f").write_text("1")
    git("add", "f")
    state = provenance.git_state(tmp_path)
    assert len(state["commit"]) == 40 and state["dirty"] is True
    assert provenance.git_state(tmp_path / "nowhere") == {"commit": "unknown", "dirty": None}


def test_invocations_are_appended_and_ended(tmp_path: Path):
    paths = RunPaths.open(str(tmp_path), "run")
    Path(paths.run_dir).mkdir()
    first = provenance.start_invocation(paths, provenance.collect(["a"]), arms={"x": {"seed": 1}})
    provenance.end_invocation(paths, first, outcome="finished")
    second = provenance.start_invocation(paths, provenance.collect(["b"]))
    stored = json.loads((Path(paths.run_dir) / provenance.PROVENANCE_FILE).read_text())
    assert stored["arms"] == {"x": {"seed": 1}}  # kept when a later invocation is added
    runs = stored["invocations"]
    assert (first, second) == (0, 1) and [r["command"] for r in runs] == [["a"], ["b"]]
    assert runs[0]["outcome"] == "finished" and runs[0]["ended"] and runs[1]["ended"] is None
    assert not provenance.missing_fields(runs[1])
    assert runs[1]["packages"]["torch"] != "unknown"


def test_an_iteration_records_its_invocation(prefect_harness, tmp_path: Path):
    args = ["--artifacts-root", str(tmp_path), "--run-name", "prov", "--no-wandb"]
    dummy = ["--set", "agents._default.use_dummy_api=true", "--set", "rl.rollouts_per_iteration=2"]
    assert iteration_main([*args, *dummy]) == 0
    stored = json.loads((tmp_path / "prov" / provenance.PROVENANCE_FILE).read_text())
    (record,) = stored["invocations"]
    assert record["outcome"] == "finished" and record["command"]  # this process's argv
    assert record["machine"]["cores"] >= 1 and record["commit"]
