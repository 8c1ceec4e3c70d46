"""Reference arms and the shuffled-label control: rules fitted by hand, labels permuted only
where training reads them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nip_core.data.splits import load_split
from nip_core.experiment.config import ExperimentSettings, arm_hyper_params, split_config
from nip_core.experiment.reference import REFERENCE_ARMS, code_features, fit_rule, reference_rows
from nip_core.parameters import HyperParameters
from nip_core.parameters.loading import read_params_file

STUB = 'def f(x):\n    """Double x."""\n    pass\n'
REAL = 'def f(x):\n    """Double x."""\n    y = x * 2\n    if y:\n        return y\n    return 0\n'
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "experiment-cpu-easy.yaml"


def test_code_features_leave_the_docstring_out():
    assert code_features(STUB)["body_lines"] == 1 and code_features(REAL)["body_lines"] == 4
    assert code_features(REAL)["body_statements"] == 4  # assign, if, return, return
    assert code_features("def broken(:\n  x\n")["body_lines"] == 2  # unparsable: line count


def test_fit_rule_finds_the_separating_feature_and_scores_reference_arms():
    solutions = pd.Series([STUB, REAL, STUB, REAL])
    rule = fit_rule(solutions, pd.Series([0, 1, 0, 1]))
    assert rule.train_accuracy == 1.0 and rule.sign == 1
    assert rule.score(code_features(REAL)) > 0.5 > rule.score(code_features(STUB))
    base = pd.DataFrame(
        {
            "seed": 3, "arm": "base", "iteration": 0, "datapoint_id": [1, 1, 2, 2],
            "sample": [0, 1, 0, 1], "decision": pd.array([None, 1, 0, None], dtype="Int64"),
            "y": [1, 1, 0, 0], "correct": [False, True, True, False],
            "decided": [False, True, True, False], "model_calls": 1, "tokens": 3,
            "p_accept": np.nan,
        }
    )  # fmt: skip
    rows = reference_rows(base, {1: REAL, 2: STUB}, rule)
    assert rows.groupby("arm", sort=False)["correct"].mean().to_dict() == {
        "always_accept": 0.5,
        "always_reject": 0.5,
        "one_feature_rule": 1.0,
    }
    assert set(rows["arm"]) == set(REFERENCE_ARMS) and (rows["model_calls"] == 0).all()
    assert rows["y"].tolist() == base["y"].tolist() * 3  # the same episodes and labels


def test_shuffled_labels_permute_only_the_training_rows():
    data, _ = split_config(read_params_file(CONFIG))
    hp = HyperParameters.from_dict(data)
    shuffled = arm_hyper_params(
        hp, ExperimentSettings(arms={"shuffled_labels": {}}), "shuffled_labels"
    )
    assert shuffled.text_rl.shuffle_training_labels and not hp.text_rl.shuffle_training_labels
    plain_train, mixed_train = load_split(hp, "train"), load_split(shuffled, "train")
    columns = [c for c in plain_train.columns if c != "y"]
    assert plain_train[columns].equals(mixed_train[columns])  # same rows, same order
    assert sorted(plain_train["y"]) == sorted(mixed_train["y"])  # a permutation
    assert (plain_train["y"] != mixed_train["y"]).mean() > 0.3  # and it moved labels
    for split in ("validation", "test"):
        assert load_split(hp, split).equals(load_split(shuffled, split)), split


@pytest.mark.parametrize("seeds", [0, -1, [1, 1], "two", [True]])
def test_bad_seeds_are_refused(seeds):
    from nip_core.experiment.config import parse_settings

    with pytest.raises(ValueError, match="experiment.seeds"):
        parse_settings({"seeds": seeds})


def test_arms_are_picked_added_and_dropped_from_the_command_line():
    from nip_core.experiment.config import settings_with_overrides

    section = {"iterations": 1, "arms": {"malt": {}, "shuffled_labels": {}}}
    only_malt = settings_with_overrides(section, {"arms.shuffled_labels": None})
    assert only_malt["arms"] == {"malt": {}} and section["arms"] == {
        "malt": {},
        "shuffled_labels": {},
    }
    added = settings_with_overrides(section, {"arms.proper": {"experiment_x": 1}, "iterations": 3})
    assert added["arms"] == {"malt": {}, "shuffled_labels": {}, "proper": {"experiment_x": 1}}
    assert added["iterations"] == 3
    replaced = settings_with_overrides(section, {"arms": {"ei": {}}, "arms.malt": {}})
    assert replaced["arms"] == {"ei": {}, "malt": {}}
    with pytest.raises(ValueError, match="no arm 'ei'"):
        settings_with_overrides(section, {"arms.ei": None})
    with pytest.raises(ValueError, match="not a settable field"):
        settings_with_overrides(section, {"iterations.x": 1})
