"""A reply drawn from a closed set: our `/v1/chat/completions` extension `candidates`.

A request may list the texts its reply must be one of (like vLLM's guided choice, but read by
likelihood, not decoded token by token). The served model scores each candidate as the reply
to the chat (`engine.score`), and the `n` replies are drawn from those scores. A candidate's
log-probability is taken per token and scaled to the candidates' mean length: summed, the
shorter candidate wins for its length alone (a 135M model ranks a question's correct version
of a line above its buggy twin's for 0.848 of medium validation questions per token, 0.636
summed, docs/results/probe-line-choice). `temperature` divides those scores, 0 takes the
best. Pure.
"""

from __future__ import annotations

import numpy as np

from nip_core.model_api.temperatures import CANDIDATES_MAX_TEMPERATURE, DECODED_MAX_TEMPERATURE

MAX_CANDIDATES = 16


def check_candidates(candidates: object) -> list[str]:
    """The request's candidates: 2 to MAX_CANDIDATES distinct non-empty texts (a clear
    ValueError otherwise)."""
    if (
        not isinstance(candidates, list | tuple)
        or not 2 <= len(candidates) <= MAX_CANDIDATES
        or not all(isinstance(c, str) and c for c in candidates)
    ):
        raise ValueError(
            f"candidates must be a list of 2 to {MAX_CANDIDATES} non-empty strings, "
            f"got {candidates!r}"[:300]
        )
    if len(set(candidates)) != len(candidates):
        raise ValueError("candidates must be distinct")
    return list(candidates)


def check_temperature(temperature: float | None, among_candidates: bool) -> None:
    """A ValueError naming the range where a reply's temperature is above its kind's bound."""
    if temperature is not None and temperature > DECODED_MAX_TEMPERATURE and not among_candidates:
        raise ValueError(
            f"temperature={temperature!r} is out of range: a decoded reply takes 0 to "
            f"{DECODED_MAX_TEMPERATURE}; only a draw among `candidates` goes to "
            f"{CANDIDATES_MAX_TEMPERATURE}"
        )


def candidate_scores(scores: list[tuple[float, int]]) -> np.ndarray:
    """Each candidate's log-probability per token times the candidates' mean token count, from
    its (summed log-probability, tokens)."""
    logprob = np.array([s for s, _ in scores], dtype=float)
    tokens = np.array([max(t, 1) for _, t in scores], dtype=float)
    return logprob / tokens * tokens.mean()


def choice_probabilities(scores: np.ndarray, temperature: float) -> np.ndarray:
    """Softmax of `scores / temperature`; temperature 0 puts all weight on the best (the first
    of equals)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        weights = np.zeros(len(scores))
        weights[int(np.argmax(scores))] = 1.0
        return weights
    shifted = (scores - scores.max()) / temperature
    weights = np.exp(shifted)
    return weights / weights.sum()


def draw_candidates(
    scores: list[tuple[float, int]], n: int, temperature: float | None, seed: int | None
) -> list[int]:
    """Indices of `n` candidates drawn by their scores (`temperature` None: 1); the same
    `seed` draws the same indices."""
    p = choice_probabilities(candidate_scores(scores), 1.0 if temperature is None else temperature)
    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.choice(len(p), size=n, p=p)]
