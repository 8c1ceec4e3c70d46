"""Best-of-N by pairwise votes: which of N candidate solutions to a question does a pairwise
verifier put first?

A pairwise verifier answers "is Solution A the correct one?" for an ordered pair. Put every
ordered pair of a question's N candidates to it (both orders, so position bias cancels) and
give each candidate its probability of being the correct one in every comparison it takes
part in; the top-ranked candidate is the verifier's pick. The same round robin ranks by any
other pairwise score, and the likelihood baseline ranks by the model's own log-probability per
token. A question counts as solved when its pick is the correct candidate; a tie shares the
credit among the tied candidates (a verifier that scores every candidate alike is credited
1/N, the rate of a random pick). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np


def ordered_pairs(count: int) -> list[tuple[int, int]]:
    """Every ordered pair (first shown, second shown) of `count` candidates."""
    return [(i, j) for i in range(count) for j in range(count) if i != j]


def round_robin_scores(count: int, p_first: Mapping[tuple[int, int], float]) -> np.ndarray:
    """Each candidate's summed probability of being the correct one over its comparisons:
    P(first correct) when it is shown first, 1 - P when second."""
    scores = np.zeros(count)
    for (first, second), p in p_first.items():
        scores[first] += p
        scores[second] += 1.0 - p
    return scores


def pick_credit(scores: Sequence[float], correct: int, tolerance: float = 1e-9) -> float:
    """1 if the correct candidate alone scores highest, 1/k if it ties with k-1 others, else 0."""
    values = np.asarray(scores, dtype=float)
    top = np.flatnonzero(values >= values.max() - tolerance)
    return 1.0 / len(top) if correct in top else 0.0


def share_solved(
    questions: Sequence[tuple[int, int]], score: Callable[[int], Sequence[float]]
) -> float:
    """Mean pick credit over `questions` ((question index, correct candidate index) each),
    ranking each question's candidates by `score(question index)`."""
    credits = [pick_credit(score(q), correct) for q, correct in questions]
    return float(np.mean(credits)) if credits else float("nan")
