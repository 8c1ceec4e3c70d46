"""Extending a run: `rl.num_iterations` is when a run stops, not what it is."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from nip_core.experiment.seed_outputs import rows_cover
from nip_core.run.artifacts import RunPaths, new_manifest, write_json
from nip_core.run.run_folder import ConfigError, prepare_run, stored_config
from tests.test_parameters import hyper


def test_a_larger_iteration_count_extends_the_run_and_is_stored(tmp_path):
    two, three = hyper(rl={"num_iterations": 2}), hyper(rl={"num_iterations": 3})
    paths = prepare_run(two, str(tmp_path), "r")
    write_json(paths.fs, paths.manifest(0), new_manifest("r", 0, two.config_hash()))
    prepare_run(three, str(tmp_path), "r")
    assert stored_config(paths)[1].rl.num_iterations == 3
    with pytest.raises(ConfigError, match="different configuration"):
        prepare_run(hyper(seed=1, rl={"num_iterations": 3}), str(tmp_path), "r")


def test_manifests_holding_the_legacy_hash_are_upgraded(tmp_path):
    """A folder written while the hash counted the iterations resumes, and extends."""
    two, three = hyper(rl={"num_iterations": 2}), hyper(rl={"num_iterations": 3})
    paths = RunPaths.open(str(tmp_path), "old")
    write_json(paths.fs, paths.hyper_params, two.to_dict(include_package_meta=True))
    for it in (0, 1):
        write_json(paths.fs, paths.manifest(it), new_manifest("old", it, two.legacy_config_hash()))
    other = new_manifest("old", 2, "f" * 64)  # not this run's: left for load_manifest to refuse
    write_json(paths.fs, paths.manifest(2), other)
    prepare_run(three, str(tmp_path), "old")
    hashes = [json.loads(open(paths.manifest(it)).read())["config_hash"] for it in (0, 1, 2)]
    assert hashes == [three.config_hash(), three.config_hash(), "f" * 64]


def test_a_folder_stored_in_an_older_format_is_upgraded(tmp_path):
    """Settings since moved (the server's, once per agent) or dropped (nip's tensor-era ones)
    change the hash under a run's manifests: they are upgraded, the configuration restored in
    today's format, and the run resumes."""
    hp = hyper(agents={"_default": {"model_provider": "SelfHosted"}}, server={"engine": "vllm"})
    old = hp.to_dict(include_package_meta=True)
    old["agents"]["_default"] |= {
        "language_model_server_engine": "vllm",
        "use_manual_architecture": False,
    }
    del old["server"]
    paths = RunPaths.open(str(tmp_path), "r")
    write_json(paths.fs, paths.hyper_params, old)
    write_json(paths.fs, paths.manifest(0), new_manifest("r", 0, "a" * 64))
    prepare_run(hp, str(tmp_path), "r")
    assert json.loads(open(paths.manifest(0)).read())["config_hash"] == hp.config_hash()
    stored = json.loads(open(paths.hyper_params).read())
    assert stored["server"]["engine"] == "vllm"
    assert "language_model_server_engine" not in stored["agents"]["_default"]


def test_rows_cover_every_arm_and_iteration():
    rows = pd.DataFrame({"arm": ["base", "malt", "malt"], "iteration": [0, 1, 2]})
    assert rows_cover(rows, {"malt": 2})
    assert not rows_cover(rows, {"malt": 3})
    assert not rows_cover(rows, {"malt": 2, "shuffled_labels": 2})
