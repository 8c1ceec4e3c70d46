"""docs/results.md: every number in its tables is recomputed from the rows it cites.

A table row names its result folder last (`[name](results/name/)`); its arm and iteration pick
the folder's across-seed summary row, and every cell must read as `scripts/results_rows.py`
makes it from that row: the seed count, decided accuracy (`accuracy_when_decided`) and AUC with
their CIs, and accept rate (three decimals); the minutes, the arm's mean wall time per seed up to
that iteration (`wall_seconds`, "–" where none was recorded); the commit cell, the folder's
provenance commits (seven characters, or "unknown"). The README's learning part stays short.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "results.md"
ROW = re.compile(r"^\|(.+)\|\s*\[([\w.-]+)\]\(results/([\w.-]+)/?\)\s*\|$")
COLUMNS = ("arm", "iteration", "seeds", "decided", "auc", "accept", "minutes", "machine", "commit")


results_rows = load_script("results_rows")  # the script that makes the page's rows


def run_script(name: str, *args: str) -> list[str]:
    """The stdout lines of scripts/<name>.py run as users run it; a failure shows its stderr."""
    import subprocess
    import sys

    command = [sys.executable, str(ROOT / "scripts" / f"{name}.py"), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def table_rows() -> list[tuple[list[str], str]]:
    """(cells before the folder, folder) of every table row that cites a result folder."""
    rows = []
    for line in PAGE.read_text().splitlines():
        match = ROW.match(line.strip())
        if match:
            assert match[2] == match[3], f"link text and target differ: {line}"
            rows.append(([c.strip() for c in match[1].split("|")], match[3]))
    return rows


def test_the_page_is_short_and_cites_rows():
    assert len(PAGE.read_text().splitlines()) <= 250
    assert len(table_rows()) >= 20


@pytest.mark.parametrize("row", table_rows(), ids=lambda r: f"{r[1]}:{r[0][0]}:{r[0][1]}")
def test_every_number_is_recomputed_from_its_folder(row):
    cells, folder = row
    assert len(cells) == len(COLUMNS), cells
    arm = re.search(r"`([\w-]+)`", cells[0])[1]
    expected = results_rows.table_cells(folder, arm, int(cells[1]), machine=cells[7])
    for column, shown, made in zip(COLUMNS, cells, expected, strict=False):
        assert shown == made, (folder, arm, cells[1], column)


def test_the_readme_learning_part_is_at_most_40_lines():
    text = (ROOT / "README.md").read_text()
    part = text.split("## Does training make a better verifier?", 1)[1].split("\n## ", 1)[0]
    assert len(part.strip().splitlines()) <= 40


def test_argmax_readings_tell_sharper_sampling_from_a_moved_preference():
    """scripts/argmax_readings.py on the published fill_in_choice test seed: the base samples
    0.743 right while its argmax reads 0.824, and `malt` after 2 rises in sampling only."""
    lines = run_script("argmax_readings", "fill-in-choice-test", "--resamples", "50")
    assert "seed 6198 malt it 0: decided 0.743, argmax 0.824" in "\n".join(lines)
    assert "seed 6198 malt it 2: decided 0.809, argmax 0.794" in "\n".join(lines)


def test_paired_against_takes_another_arm_as_the_reference():
    """Two arms on the same episodes: the difference is theirs, not against the base model, and
    an arm equal to the reference reads 0 with a zero-width CI."""
    import pandas as pd

    paired_against = load_script("paired_against")
    rows = []
    for seed in (1, 2):
        for datapoint in range(8):
            y = datapoint % 2
            for arm, right in (("base", False), ("solo", datapoint != 0), ("game", True)):
                decision = y if right else 1 - y
                rows.append((seed, arm, 1 if arm != "base" else 0, datapoint, 0, decision, y))
    columns = ["seed", "arm", "iteration", "datapoint_id", "sample", "decision", "y"]
    table = pd.DataFrame(rows, columns=columns)
    table = table.assign(correct=table["decision"] == table["y"], decided=True, model_calls=1)
    table = table.assign(tokens=1, p_accept=float("nan"))
    out = paired_against.against_reference(table, ("solo", 1), [("game", 1), ("solo", 1)], 200)
    assert set(zip(out["arm"], out["iteration"], strict=True)) == {("game", 1), ("solo", 1)}
    across = out[out["scope"] == "across_seeds"].set_index("arm")
    assert across.loc["game", "accuracy_when_decided"] == 1.0
    assert abs(across.loc["game", "decided_diff_vs_base"] - 1 / 8) < 1e-12
    assert across.loc["solo", ["decided_diff_ci_low", "decided_diff_ci_high"]].tolist() == [0, 0]


def test_paired_against_takes_the_reference_from_a_folder_with_the_same_base_draws():
    import pandas as pd

    paired_against = load_script("paired_against")
    columns = ["seed", "arm", "iteration", "datapoint_id", "sample", "y", "decision"]
    base = [(1, "base", 0, d, 0, d % 2, 1) for d in range(4)]
    new = pd.DataFrame(
        [*base, *[(1, "new", 1, d, 0, d % 2, d % 2) for d in range(4)]], columns=columns
    )
    old = pd.DataFrame([*base, *[(1, "old", 1, d, 0, d % 2, 1) for d in range(4)]], columns=columns)
    joined = paired_against.with_reference_from(new, old, ("old", 1))
    assert sorted(set(joined["arm"])) == ["base", "new", "old"] and len(joined) == 12
    redrawn = old.assign(decision=1 - old["decision"])  # another base draw: not comparable
    with pytest.raises(SystemExit, match="base episodes differ"):
        paired_against.with_reference_from(new, redrawn, ("old", 1))
    with pytest.raises(SystemExit, match="share no seed"):
        paired_against.with_reference_from(new, old.assign(seed=2), ("old", 1))


def test_paired_against_reads_the_nip_folder():
    arms = ("--reference", "label_pairs:1", "--arm", "nip_from_solo:1", "--resamples", "50")
    lines = run_script("paired_against", "rung-e4-from-solo", *arms)
    across = [line for line in lines if line.lstrip().startswith("across")]
    assert len(across) == 1 and " 0.965 " in across[0] and " 0.015 " in across[0], across


def test_question_margins_orients_by_the_correct_solution_and_counts_per_model():
    """P(right) is P(accept) where Solution A is correct and 1 - P(accept) where it is not; a
    question is its two orders together (`pair_buggy_id`)."""
    import pandas as pd

    question_margins = load_script("question_margins")
    rows = [  # buggy row 5 (pair ids 10, 11), buggy row 6 (12, 13)
        ("base", 0, 10, 1, 0.55),  # correct first: P(right) 0.55
        ("base", 0, 11, 0, 0.45),  # buggy first: P(right) 0.55
        ("base", 0, 12, 1, 0.30),
        ("base", 0, 13, 0, 0.70),
        ("malt", 1, 10, 1, 0.95),
        ("malt", 1, 11, 0, 0.05),
        ("malt", 1, 12, 1, 0.45),
        ("malt", 1, 13, 0, 0.55),
    ]
    frame = pd.DataFrame(rows, columns=["arm", "iteration", "datapoint_id", "y", "p_accept"])
    frame["seed"] = 7
    table = question_margins.right_version_probability(frame, "malt")
    assert table["base"].tolist() == pytest.approx([0.55, 0.30])
    assert table["7.1"].tolist() == pytest.approx([0.95, 0.45])
    counts = question_margins.model_counts(table)
    assert counts.loc["base"].tolist() == [1, 0, 1] and counts.loc["7.1"].tolist() == [1, 1, 1]
    assert question_margins.agreement(table) == {"every": 1, "none": 1, "some": 0}
    with pytest.raises(ValueError, match="no episodes of arm 'other'"):
        question_margins.right_version_probability(frame, "other")


def test_question_margins_reads_the_published_fill_in_seeds():
    lines = run_script("question_margins", "fill-in-choice-nothing-test", "--arm", "malt_t2")
    assert "  base: right 30, sure 1, near tie 23" in lines
    assert lines[-1].strip() == "trained models: every one right on 24, none on 1, some on 9"
