"""Every config the repository ships loads and checks, so a typo fails here, not an hour in."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows.experiment import resolve_experiment
from nip_core.parameters import HyperParameters
from nip_core.parameters.loading import read_params_file

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_there_are_configs():
    assert len(CONFIGS) >= 5


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads_and_checks(path):
    if "experiment" in yaml.safe_load(path.read_text()):
        experiment = resolve_experiment(str(path), [])
        assert experiment.arms, f"{path.name} names no arm"
        for arm, hp in experiment.arms.items():
            assert 1 <= hp.rl.num_iterations <= experiment.settings.iterations, arm
    else:
        HyperParameters.from_dict(read_params_file(path))


def test_cpu_experiments_differ_only_in_the_grade():
    """The easy-grade experiment is the default one on easier data: results compare."""
    configs = Path(__file__).resolve().parents[1] / "configs"
    mixed = yaml.safe_load((configs / "experiment-cpu.yaml").read_text())
    easy = yaml.safe_load((configs / "experiment-cpu-easy.yaml").read_text())
    assert easy.pop("dataset_options") == {"difficulty": "easy", **mixed.pop("dataset_options")}
    assert easy == mixed
