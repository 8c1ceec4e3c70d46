"""scripts/averaged_argmax.py: models averaged by P(accept) before the verdict."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.script_modules import load_script


def episodes(arm: str, iteration: int, p_accept: list[float | None], seed: int = 1) -> pd.DataFrame:
    """Four episodes, labels 1, 0, 1, 0."""
    return pd.DataFrame(
        {
            "seed": seed,
            "arm": arm,
            "iteration": iteration,
            "datapoint_id": [f"d{i}" for i in range(4)],
            "sample": 0,
            "y": [1, 0, 1, 0],
            "p_accept": p_accept,
        }
    )


def test_average_decides_where_the_members_disagree() -> None:
    script = load_script("averaged_argmax")
    frame = pd.concat(
        [episodes("a", 1, [0.9, 0.6, 0.4, 0.1]), episodes("b", 2, [0.8, 0.2, 0.7, 0.7])]
    )
    alone = script.averaged_argmax(frame, [("a", 1)])
    assert alone.loc[1] == pytest.approx(0.5)
    # means 0.85, 0.4, 0.55, 0.4: all four right
    averaged = script.averaged_argmax(frame, script.parse_ensemble("a:1+b:2"))
    assert averaged.loc[1] == pytest.approx(1.0)


def test_ties_count_half_and_missing_scores_are_left_out() -> None:
    script = load_script("averaged_argmax")
    frame = pd.concat(
        [episodes("a", 1, [0.6, 0.4, None, 0.2]), episodes("b", 1, [0.4, 0.6, 0.9, 0.2])]
    )
    # means 0.5 (tie), 0.5 (tie), missing, 0.2 (right): (0.5 + 0.5 + 1) / 3
    assert script.averaged_argmax(frame, [("a", 1), ("b", 1)]).loc[1] == pytest.approx(2 / 3)


def test_unknown_member_and_bad_term_are_refused() -> None:
    script = load_script("averaged_argmax")
    frame = episodes("a", 1, [0.9, 0.1, 0.9, 0.1])
    with pytest.raises(SystemExit, match="a:2: no episodes"):
        script.averaged_argmax(frame, [("a", 2)])
    with pytest.raises(SystemExit, match="expected arm:iteration"):
        script.parse_ensemble("a:1+b")
