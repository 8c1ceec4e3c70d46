"""Two solutions to one question, for the pairwise protocol: which of them is correct?

A solo verifier judges one solution on its own. The embedded 135M model holds only a relative
trace of a one-line bug: its likelihood ranks a correct solution above its own buggy twin for
most medium- and mixed-grade questions, yet nothing in it separates correct from buggy code
across questions (`docs/results/probe-grades/`). The pairwise protocol gives the verifier that
contrast: each question with a correct and a buggy solution becomes two datapoints, the correct
one shown first (`y` = 1, the verifier should accept Solution A) and second (`y` = 0, it should
reject Solution A for Solution B). Every pair is seen in both orders, so a verifier that answers
by position scores exactly 0.5, and its accuracy by order shows any position bias. Pure.
"""

from __future__ import annotations

import pandas as pd

PAIRWISE_PROTOCOLS: tuple[str, ...] = ("pairwise",)
PAIR_COLUMNS = ("id", "question", "solution", "other_solution", "y", "prover_stance")


def shows_pairs(protocol_name: str) -> bool:
    """Whether the protocol's datapoints are solution pairs."""
    return protocol_name in PAIRWISE_PROTOCOLS


def pair_id(buggy_id: int, correct_first: bool) -> int:
    """A pair's datapoint id: unique given unique row ids (a buggy row belongs to one question
    and meets that question's one correct row)."""
    return 2 * int(buggy_id) + (0 if correct_first else 1)


def pairwise_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Both orders of every (correct, buggy) pair of solutions to one question, sorted by id.

    Rows are grouped by `problem_id` (by question text where there is none). A question needs
    exactly one correct row; each of its buggy rows makes a pair with it, and questions without
    a correct or a buggy row make none. Kept alongside the datapoint columns: `problem_id`, and
    the buggy row's `mutation` and `difficulty` where the frame has them.
    """
    key = "problem_id" if "problem_id" in frame.columns else "question"
    extra = [c for c in ("mutation", "difficulty", "split") if c in frame.columns]
    records = []
    for problem, rows in frame.groupby(key, sort=False):
        correct, buggy = rows[rows["y"] == 1], rows[rows["y"] == 0]
        if len(correct) > 1:
            raise ValueError(
                f"question {problem!r} has {len(correct)} correct solutions; a pair needs one"
            )
        if correct.empty:
            continue
        good = correct.iloc[0]
        for bad in buggy.itertuples(index=False):
            bad = bad._asdict()
            for correct_first in (True, False):
                first, second = (good, bad) if correct_first else (bad, good)
                records.append(
                    {
                        "id": pair_id(bad["id"], correct_first),
                        "question": good["question"],
                        "solution": first["solution"],
                        "other_solution": second["solution"],
                        "y": 1 if correct_first else 0,
                        "prover_stance": int(first["prover_stance"]),
                        "problem_id": problem,
                        **{c: bad[c] for c in extra},
                    }
                )
    columns = [*PAIR_COLUMNS, "problem_id", *extra]
    pairs = pd.DataFrame.from_records(records, columns=columns)
    return pairs.sort_values("id", kind="stable").reset_index(drop=True)


def changed_line_blocks(first: str, second: str) -> list[tuple[int, int, int, int]]:
    """Where two solutions differ, line by line: (a0, a1, b0, b1) for each changed block, lines
    a0:a1 of `first` standing where `second` has b0:b1."""
    import difflib

    matcher = difflib.SequenceMatcher(a=first.splitlines(), b=second.splitlines(), autojunk=False)
    return [(a0, a1, b0, b1) for tag, a0, a1, b0, b1 in matcher.get_opcodes() if tag != "equal"]


def solution_difference(first: str, second: str) -> str:
    """Where two solutions differ, line by line: each changed block as Solution A has it, then as
    Solution B has it, with the line number in A. The contrast made local, for a verifier
    template (`solution_difference`): the model's relative trace of a bug sits in these lines."""
    a_lines, b_lines = first.splitlines(), second.splitlines()
    blocks = []
    for a0, a1, b0, b1 in changed_line_blocks(first, second):
        a_text = "\n".join(a_lines[a0:a1]) or "(nothing)"
        b_text = "\n".join(b_lines[b0:b1]) or "(nothing)"
        blocks.append(
            f"At line {a0 + 1} of Solution A:\nSolution A has:\n{a_text}\nSolution B has:\n{b_text}"
        )
    return "\n\n".join(blocks) or "(the two solutions are the same)"
