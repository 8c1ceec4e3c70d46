"""Two solutions to one question, for the pairwise protocol: which of them is correct?

A solo verifier judges one solution on its own. The embedded 135M model holds only a relative
trace of a one-line bug: its likelihood ranks a correct solution above its own buggy twin for
most medium- and mixed-grade questions, yet nothing in it separates correct from buggy code
across questions (`docs/results/probe-grades/`). The pairwise protocol gives the verifier that
contrast: each question with a correct and a buggy solution becomes two datapoints, the correct
one shown first (`y` = 1, the verifier should accept Solution A) and second (`y` = 0, it should
reject Solution A for Solution B). Every pair is seen in both orders, so a verifier that answers
by position scores exactly 0.5, and its accuracy by order shows any position bias.

The fill-in protocol uses the same pairs differently: the verifier sees the solution with the
part where the two differ cut out (`masked_solution`) and writes that part; its verdict is the
version its writing is nearer (`nearer_version`). Where one solution has no lines in that part
(a deleted or inserted line), its version is written `NOTHING_HERE`. Pure.
"""

from __future__ import annotations

import difflib
import re
from typing import NamedTuple

import pandas as pd

from nip_core.episode import Datapoint
from nip_core.parameters.protocol_kinds import CLOSED_REPLY_PROTOCOLS, PAIR_PROTOCOLS

PAIR_COLUMNS = ("id", "question", "solution", "other_solution", "y", "prover_stance")
NOTHING_HERE = "(nothing)"  # how a version with no lines in a changed place is written


def shows_pairs(protocol_name: str) -> bool:
    """Whether the protocol's datapoints are solution pairs (`HyperParameters.shows_pairs` for a
    protocol name alone)."""
    return protocol_name in PAIR_PROTOCOLS


def writes_disputed_part(protocol_name: str) -> bool:
    """Whether the protocol's verifier gives its verdict by writing the disputed part rather than
    by stating it (the fill-in protocols: written freely, or chosen from the two versions)."""
    return protocol_name in ("fill_in", "fill_in_choice")


def chooses_disputed_part(protocol_name: str) -> bool:
    """Whether the verifier's reply is one of the two versions of the disputed part, drawn by
    its own probability of writing each (`fill_in_choice`), rather than any text it writes."""
    return protocol_name in CLOSED_REPLY_PROTOCOLS


def pair_id(buggy_id: int, correct_first: bool) -> int:
    """A pair's datapoint id: unique given unique row ids (a buggy row belongs to one question
    and meets that question's one correct row)."""
    return 2 * int(buggy_id) + (0 if correct_first else 1)


def pair_buggy_id(pair_datapoint_id: int) -> int:
    """The buggy row's id of a pair datapoint (`pair_id` undone): one id per question, the same
    for both orders."""
    return int(pair_datapoint_id) // 2


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
    matcher = difflib.SequenceMatcher(a=first.splitlines(), b=second.splitlines(), autojunk=False)
    return [(a0, a1, b0, b1) for tag, a0, a1, b0, b1 in matcher.get_opcodes() if tag != "equal"]


def solution_difference(first: str, second: str) -> str:
    """Where two solutions differ, line by line: each changed block as Solution A has it, then as
    Solution B has it, with the line number in A. The contrast made local, for a verifier
    template (`solution_difference`): the model's relative trace of a bug sits in these lines."""
    a_lines, b_lines = first.splitlines(), second.splitlines()
    blocks = []
    for a0, a1, b0, b1 in changed_line_blocks(first, second):
        a_text, b_text = version_text(a_lines[a0:a1]), version_text(b_lines[b0:b1])
        blocks.append(
            f"At line {a0 + 1} of Solution A:\nSolution A has:\n{a_text}\nSolution B has:\n{b_text}"
        )
    return "\n\n".join(blocks) or "(the two solutions are the same)"


def version_text(lines: list[str]) -> str:
    """One version of a changed place as a verifier reads or writes it: its lines, or
    `NOTHING_HERE` where it has none."""
    return "\n".join(lines) or NOTHING_HERE


class DisputedPart(NamedTuple):
    """Two solutions split where they differ: the lines they share before and after, and the one
    span of lines between, as each has it (one side empty where a line was deleted or
    inserted, never both)."""

    before: list[str]
    first: list[str]
    second: list[str]
    after: list[str]


def disputed_part(first: str, second: str) -> DisputedPart:
    """The smallest span of lines covering every place two solutions differ. A deleted line is
    not widened by a shared neighbour: the 135M model then preferred the shared line alone to
    the shared line plus the deleted one per token, and lost both line-deleting test bugs of the
    medium grade that it ranks right as the deleted line against `NOTHING_HERE`
    (docs/learning.md, "The empty side of a fill-in"). Raises ValueError for identical
    solutions."""
    changes = changed_line_blocks(first, second)
    if not changes:
        raise ValueError("the two solutions are the same; there is no disputed part")
    a_lines, b_lines = first.splitlines(), second.splitlines()
    a0, b0 = changes[0][0], changes[0][2]
    a1, b1 = changes[-1][1], changes[-1][3]
    return DisputedPart(a_lines[:a0], a_lines[a0:a1], b_lines[b0:b1], a_lines[a1:])


def datapoint_disputed_part(datapoint: Datapoint) -> DisputedPart:
    """`disputed_part` of a pair datapoint (Solution A first); a clear error where it has no
    second solution."""
    if datapoint.other_solution is None:
        raise ValueError(
            f"datapoint {datapoint.id}: a fill-in verdict needs the pair's two solutions"
        )
    return disputed_part(datapoint.solution, datapoint.other_solution)


MISSING_PART_MARKER = "# <the missing part>"


def masked_solution(first: str, second: str) -> str:
    """The first solution with its disputed part cut out: one marker line, indented as the
    part's first line, stands where the two solutions differ (the shared lines are the same in
    both, so this shows neither version)."""
    part = disputed_part(first, second)
    lines = part.first or part.second  # the version that has lines there (the same in any order)
    indent = re.match(r"[ \t]*", lines[0]).group(0)
    return "\n".join([*part.before, indent + MISSING_PART_MARKER, *part.after])


def _normalised(code: str) -> str:
    return "\n".join(" ".join(line.split()) for line in code.splitlines() if line.strip())


def written_code(text: str) -> str:
    """The code in a reply: the first fenced block's body if it has one (an unclosed fence runs
    to the end), else the whole text."""
    match = re.search(r"```[^\n`]*\n(.*?)(?:```|\Z)", text, re.DOTALL)
    return match.group(1) if match else text


def nearer_version(text: str, first: str, second: str) -> int | None:
    """1 if the code written in `text` is nearer `first`, 0 if nearer `second`, None if it is
    as near to both (or both versions read the same). Nearness is difflib's similarity ratio
    over the code with indentation and runs of spaces ignored, so a writing that keeps the
    correct comparison but renames a variable still lands on its side."""
    code, a, b = _normalised(written_code(text)), _normalised(first), _normalised(second)
    if a == b:
        return None
    ratio_a = difflib.SequenceMatcher(None, code, a, autojunk=False).ratio()
    ratio_b = difflib.SequenceMatcher(None, code, b, autojunk=False).ratio()
    if ratio_a == ratio_b:
        return None
    return 1 if ratio_a > ratio_b else 0


def version_reply(code_lines: list[str]) -> str:
    """A reply that writes one version of the disputed part and nothing else: what the
    verifier's verdict is scored and trained as in the fill-in protocol."""
    return "```python\n" + version_text(code_lines) + "\n```"
