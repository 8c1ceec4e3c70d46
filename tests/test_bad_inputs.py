"""Bad input is caught before anything is written: one `error:` line, exit status 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import flows.malt_iteration as command

SMALL = ["--set", "agents._default.use_dummy_api=true", "--no-wandb"]


def case_files(tmp: Path) -> dict[str, Path]:
    (tmp / "broken.yaml").write_text("rl: [1,\n  learning_rate: 2\n")
    (tmp / "broken.json").write_text('{"rl": {"learning_rate": 0.1,}}')
    (tmp / "list.yaml").write_text("- just\n- a list\n")
    (tmp / "a-file").write_text("not a folder")
    other = tmp / "root" / "taken"
    other.mkdir(parents=True)
    stored = command.resolve_hyper_params(None, ["seed=1"]).to_dict(include_package_meta=True)
    (other / "hyper_params.json").write_text(json.dumps(stored))
    return {"tmp": tmp}


BAD_INPUTS = {
    "malformed YAML": ["--config", "{tmp}/broken.yaml"],
    "malformed JSON": ["--config", "{tmp}/broken.json"],
    "config that is not a mapping": ["--config", "{tmp}/list.yaml"],
    "missing config file": ["--config", "{tmp}/nowhere.yaml"],
    "unknown override key": ["--set", "rl.no_such_field=1"],
    "override without '='": ["--set", "rl.learning_rate"],
    "wrong value type": ["--set", "rl.learning_rate=fast"],
    "zero rollouts per iteration": ["--set", "rl.rollouts_per_iteration=0"],
    "zero iterations": ["--set", "rl.num_iterations=0"],
    "unknown protocol": ["--set", "interaction_protocol=telepathy"],
    "unknown trainer": ["--set", "trainer=magic"],
    "temperature and top_p together": ["--set", "agents._default.top_p=0.9"],
    "LoRA dropout out of range": ["--set", "agents._default.lora_dropout=1.5"],
    "LoRA on no layers": ["--set", "agents._default.lora_top_layers=0"],
    "switch guard without validation": ["--set", "text_rl.validation_fraction=0"],
    "negative iteration": ["--iteration", "-1"],
    "run name escaping the root": ["--run-name", "../escape"],
    "missing dataset folder": [
        "--set",
        "dataset=buggy-apps",
        "--set",
        "dataset_options.local_path={tmp}/no-such-dataset",
    ],
    "artifacts root under a file": ["--artifacts-root", "{tmp}/a-file/root"],
    "run folder of another configuration": ["--run-name", "taken"],
}


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_one_error_line_exit_2_and_writes_nothing(name, tmp_path, capsys):
    case_files(tmp_path)
    root = tmp_path / "root"
    argv = [a.format(tmp=tmp_path) for a in BAD_INPUTS[name]]
    if "--artifacts-root" not in argv:
        argv += ["--artifacts-root", str(root)]
    before = files_under(tmp_path)
    assert command.main([*SMALL, *argv]) == 2, name
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert files_under(tmp_path) == before, "a bad input must not write anything"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to read-only folders")
def test_read_only_artifacts_root(tmp_path, capsys):
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    try:
        assert command.main([*SMALL, "--artifacts-root", str(root)]) == 2
    finally:
        root.chmod(0o700)
    assert capsys.readouterr().err.startswith("error: cannot write the run folder")


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(Exception, match="rollouts_per_iteration"):
        command.main(
            [*SMALL, "--debug", "--artifacts-root", str(tmp_path)]
            + ["--set", "rl.rollouts_per_iteration=0"]
        )


def test_garbage_manifest_is_moved_aside_and_temporary_files_swept(
    prefect_harness, tmp_path, monkeypatch, caplog
):
    """A rerun repairs a garbage manifest (kept aside) and removes orphan `.tmp-` files, with
    warnings, and makes no model call again."""
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("NIP_DUMMY_CALL_LOG", str(calls))
    argv = [
        *SMALL,
        "--artifacts-root",
        str(tmp_path / "root"),
        "--run-name",
        "repair",
        "--set",
        "rl.rollouts_per_iteration=4",
        "--set",
        "interaction_protocol=solo_verifier",
    ]
    assert command.main(argv) == 0
    made = calls.read_text()
    iteration = tmp_path / "root" / "repair" / "iterations" / "0000"
    (iteration / "manifest.json").write_text("{ this is not json")
    orphan = iteration / ".tmp-0123abcd-nodes.parquet"
    orphan.write_bytes(b"half a file")
    assert command.main(argv) == 0
    assert not orphan.exists()
    aside = list(iteration.glob("manifest.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == "{ this is not json"
    assert json.loads((iteration / "manifest.json").read_text())["models_after"]
    assert calls.read_text() == made, "the repaired run must replay its calls, not redo them"
    assert "starting the iteration's manifest afresh" in caplog.text
    assert "removing a temporary file" in caplog.text
