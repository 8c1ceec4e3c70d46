"""The run commands as a user meets them: their own options, a finished iteration answered from
its manifest, one subflow run per iteration, and WANDB_DIR honoured."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flows.malt_iteration as malt_iteration_command
from flows.malt_iteration import malt_iteration
from flows.malt_run import malt_run

REPO = Path(__file__).resolve().parent.parent
SMALL = [
    "agents._default.use_dummy_api=true",
    "rl.rollouts_per_iteration=4",
    "text_rl.rollout_shard_size=2",
    "interaction_protocol=solo_verifier",
]


def help_text(module: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_malt_run_help_shows_only_its_own_options():
    text = help_text("flows.malt_run")
    assert text.startswith("usage: python -m flows.malt_run")
    assert "--iteration" not in text
    for option in ["--config", "--set", "--run-name", "--artifacts-root", "--no-wandb", "--debug"]:
        assert option in text


def test_a_finished_iteration_answers_from_its_manifest_without_a_flow_run(
    prefect_harness, tmp_path, monkeypatch, capsys
):
    root = str(tmp_path)
    first = malt_iteration(overrides=SMALL, run_name="done", artifacts_root=root, use_wandb=False)

    def no_flow(**_):
        raise AssertionError("a finished iteration must not start a flow run")

    monkeypatch.setattr(malt_iteration_command, "malt_iteration", no_flow)
    argv = ["--run-name", "done", "--artifacts-root", root, "--no-wandb"]
    for override in SMALL:
        argv += ["--set", override]
    assert malt_iteration_command.main(argv) == 0
    out = capsys.readouterr().out
    for group, model in first["models_after"].items():
        assert f"group {group} -> model {model}" in out
    # Where the time went: every stage records its wall seconds, shown in summary and report.
    manifest = json.loads((tmp_path / "done" / "iterations" / "0000" / "manifest.json").read_text())
    assert all(isinstance(entry["seconds"], float) for entry in manifest["stages"].values())
    assert "seconds per stage: batch " in out and "rollouts " in out
    from nip_core.report import read_run
    from nip_core.report.html import build_report

    assert "Wall seconds per stage" in build_report(read_run(str(tmp_path / "done")), trees=0)
    # A changed file means the iteration is not finished as recorded: the flow runs again.
    nodes = tmp_path / "done" / "iterations" / "0000" / "nodes.parquet"
    nodes.write_bytes(nodes.read_bytes() + b"x")
    with pytest.raises(AssertionError, match="must not start"):
        malt_iteration_command.main(argv)


def test_malt_run_shows_one_subflow_run_per_iteration(prefect_harness, tmp_path):
    from prefect.client.orchestration import get_client

    malt_run(
        overrides=[*SMALL, "rl.num_iterations=2"],
        run_name="subflows",
        artifacts_root=str(tmp_path),
        use_wandb=False,
    )

    async def run_names() -> set[str]:
        async with get_client() as client:
            return {run.name for run in await client.read_flow_runs(limit=200)}

    assert {"subflows-iteration-0", "subflows-iteration-1"} <= asyncio.run(run_names())


def test_wandb_dir_is_honoured(tmp_path):
    """In a fresh process (wandb reads its settings once per process)."""
    pytest.importorskip("wandb")
    code = (
        "import sys\n"
        "from nip_core.parameters import HyperParameters\n"
        "from nip_core.run.artifacts import RunPaths\n"
        "from nip_core.run.tracking import open_tracker\n"
        "paths = RunPaths.open(sys.argv[1], 'exp')\n"
        "tracker = open_tracker(paths, HyperParameters.construct_test_params(), 'exp')\n"
        "tracker.log({'a': 1.0}, 0)\n"
        "tracker.finish()\n"
    )
    (tmp_path / "wandb-here").mkdir()
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb-here")}
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "root")], cwd=REPO, env=env, check=True,
        timeout=120, capture_output=True,
    )  # fmt: skip
    assert list((tmp_path / "wandb-here").rglob("*.wandb"))
    assert not (tmp_path / "root" / "exp" / "wandb").exists()


def test_flows_take_typed_settings_the_ui_shows_as_a_form(prefect_harness, tmp_path):
    from flows.cli import RunSettings
    from flows.experiment import experiment_flow
    from flows.malt_run import malt_run as run_flow

    for flow_ in (malt_iteration, run_flow, experiment_flow):
        schema = flow_.parameters.model_dump()
        fields = schema["definitions"]["RunSettings"]["properties"]
        assert "nip" in str(fields["interaction_protocol"]) and "learning_rate" in fields
    settings = RunSettings(
        use_dummy_api=True, rollouts_per_iteration=4, interaction_protocol="solo_verifier"
    )
    malt_iteration(
        settings=settings,
        overrides=["rl.learning_rate=0.001"],
        run_name="typed",
        artifacts_root=str(tmp_path),
        use_wandb=False,
    )
    stored = json.loads((tmp_path / "typed" / "hyper_params.json").read_text())
    assert stored["interaction_protocol"] == "solo_verifier"
    assert stored["rl"]["rollouts_per_iteration"] == 4 and stored["rl"]["learning_rate"] == 0.001


def test_opening_a_run_freezes_the_long_lived_objects_once(tmp_path, monkeypatch):
    """A full collection otherwise walks every object of Prefect and the libraries and stalls
    the stage it falls into (~0.2 s); the preamble collects once and freezes them."""
    import gc

    from flows import cli
    from nip_core.parameters import HyperParameters, apply_overrides

    steps: list[str] = []
    monkeypatch.setattr(cli, "_frozen", False)
    monkeypatch.setattr(gc, "collect", lambda *a: steps.append("collect") or 0)
    monkeypatch.setattr(gc, "freeze", lambda: steps.append("freeze"))
    hp = apply_overrides(HyperParameters.construct_test_params(), SMALL)
    for run_name in ("first", "second"):
        with cli.open_run(hp, str(tmp_path), run_name):
            assert steps == ["collect", "freeze"]  # before any stage runs, and only once
