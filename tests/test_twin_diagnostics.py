"""The twin diagnostics: scripts/twin_ranking.py and the pure parts of scripts/probe_line_choice.py."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.script_modules import load_script

twin_ranking = load_script("twin_ranking")
probe_line_choice = load_script("probe_line_choice")


def episode(seed, arm, iteration, datapoint_id, y, p_accept):
    return {
        "seed": seed,
        "arm": arm,
        "iteration": iteration,
        "datapoint_id": datapoint_id,
        "y": y,
        "p_accept": p_accept,
    }


def test_twin_accuracy_averages_episodes_and_counts_each_seeds_questions():
    rows = pd.DataFrame(
        [
            # seed 1, question 5: correct 0.9 and 0.5 (mean 0.7) over buggy 0.6: right
            episode(1, "malt", 1, 5000, 1, 0.9),
            episode(1, "malt", 1, 5000, 1, 0.5),
            episode(1, "malt", 1, 5003, 0, 0.6),
            # seed 1, question 7: buggy scores higher: wrong
            episode(1, "malt", 1, 7000, 1, 0.2),
            episode(1, "malt", 1, 7003, 0, 0.4),
            # seed 2, question 5: a tie counts one half
            episode(2, "malt", 1, 5000, 1, 0.3),
            episode(2, "malt", 1, 5003, 0, 0.3),
            # seed 2, question 9: its buggy twin never scored (NaN): not counted
            episode(2, "malt", 1, 9000, 1, 0.8),
            episode(2, "malt", 1, 9003, 0, float("nan")),
            # another arm is its own row
            episode(1, "base", 0, 5000, 1, 0.1),
            episode(1, "base", 0, 5003, 0, 0.2),
        ]
    )
    table = twin_ranking.twin_table(rows, draws=200).set_index(["arm", "iteration"])
    malt = table.loc[("malt", 1)]
    assert malt["questions"] == 3
    assert malt["twin_accuracy"] == pytest.approx(0.5)  # (1 + 0 + 0.5) / 3
    assert malt["per_seed"] == {1: 0.5, 2: 0.5}
    assert 0 <= malt["ci_low"] <= malt["twin_accuracy"] <= malt["ci_high"] <= 1
    assert table.loc[("base", 0), "twin_accuracy"] == 0.0


def test_folder_rows_reads_each_seed_and_names_a_folder_without_rows(tmp_path):
    for seed in (1, 2):
        (tmp_path / "seeds" / str(seed)).mkdir(parents=True)
        pd.DataFrame([episode(seed, "base", 0, 5000, 1, 0.5)]).to_parquet(
            tmp_path / "seeds" / str(seed) / "rows.parquet"
        )
    assert sorted(twin_ranking.folder_rows(tmp_path)["seed"]) == [1, 2]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="empty: no episode rows"):
        twin_ranking.folder_rows(empty)


def test_changed_block_splits_twins_around_their_one_difference():
    good = "def f(x):\n    y = x + 1\n    return y\n"
    bad = "def f(x):\n    y = x - 1\n    return y\n"
    before, good_block, bad_block, after = probe_line_choice.changed_block(good, bad)
    assert before == ["def f(x):"] and after == ["    return y"]
    assert good_block == ["    y = x + 1"] and bad_block == ["    y = x - 1"]
    dropped = "def f(x):\n    return y\n"  # a dropped statement: the buggy block is empty
    assert probe_line_choice.changed_block(good, dropped)[1:3] == (["    y = x + 1"], [])
    two_changes = "def g(x):\n    y = x + 1\n    return -y\n"
    assert probe_line_choice.changed_block(good, two_changes) is None


def test_paired_reading_counts_ties_as_half():
    rows = [
        {"code_sum_good": -1.0, "code_sum_bad": -2.0},
        {"code_sum_good": -3.0, "code_sum_bad": -2.0},
        {"code_sum_good": -2.0, "code_sum_bad": -2.0},
        {"code_sum_good": -0.5, "code_sum_bad": -2.0},
    ]
    assert probe_line_choice.paired(rows, "code_sum") == pytest.approx(2.5 / 4)
