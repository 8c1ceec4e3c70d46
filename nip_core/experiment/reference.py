"""Reference arms: what the cheapest verifiers score on the same test episodes, untrained.

Always-accept and always-reject read the label balance (in the pairwise protocol: always
Solution A, always Solution B); the best one-feature rule (accept when a single number measured
on the code, such as the function body's length in lines, is above or below a threshold, fitted
on the train split; for a pair, the difference of the two solutions' numbers) reads how far a
surface cue goes. A trained
verifier is judged against these, not only against chance: on the easy grade, where every buggy
body is a one-line stub, the rule is nearly perfect. Pure: frames in, frames out.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from nip_core.experiment.stats import EXPERIMENT_COLUMNS

REFERENCE_ARMS = ("always_accept", "always_reject", "one_feature_rule")
LIKELIHOOD_ARM = "likelihood"  # the pairwise protocol's: the solution the base model finds likelier


def _function_bodies(tree: ast.AST) -> list[list[ast.stmt]]:
    """Each function's statements without its docstring."""
    bodies = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = list(node.body)
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            bodies.append(body)
    return bodies


def code_features(solution: str) -> dict[str, float]:
    """Numbers a one-feature rule may threshold: characters, non-blank lines, and (when the
    code parses) the lines and statements of the function bodies, docstrings left out."""
    lines = [line for line in solution.splitlines() if line.strip()]
    features = {"characters": float(len(solution)), "code_lines": float(len(lines))}
    try:
        bodies = _function_bodies(ast.parse(solution))
    except SyntaxError:
        bodies = None
    if bodies is None:
        features |= {"body_lines": float(len(lines)), "body_statements": float(len(lines))}
    else:
        spans = {
            line
            for body in bodies
            for stmt in body
            for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
        }
        statements = sum(
            1
            for body in bodies
            for stmt in body
            for node in ast.walk(stmt)
            if isinstance(node, ast.stmt)
        )
        features |= {"body_lines": float(len(spans)), "body_statements": float(statements)}
    return features


def item_features(item: str | tuple[str, str]) -> dict[str, float]:
    """A datapoint's features: its solution's; for a pair (Solution A, Solution B) of the
    pairwise protocol, A's minus B's, so the rule compares the two (accepting A when, say, its
    body is the longer)."""
    if isinstance(item, str):
        return code_features(item)
    first, second = (code_features(code) for code in item)
    return {name: first[name] - second[name] for name in first}


@dataclass(frozen=True)
class Rule:
    """Accept when `sign` x (feature - threshold) > 0."""

    feature: str
    threshold: float
    sign: int
    train_accuracy: float

    def describe(self) -> str:
        side = ">" if self.sign > 0 else "<"
        return f"accept when {self.feature} {side} {self.threshold:g}"

    def score(self, features: dict[str, float]) -> float:
        """A monotone stand-in for P(accept): above 0.5 exactly when the rule accepts."""
        z = self.sign * (features[self.feature] - self.threshold)
        return 1.0 / (1.0 + math.exp(-max(min(z, 700.0), -700.0)))


def fit_rule(solutions: pd.Series, labels: pd.Series) -> Rule:
    """The (feature, threshold, direction) with the best accuracy on these rows (ties: the
    first feature in a fixed order, then the lower threshold). `solutions` holds code, or
    (Solution A, Solution B) pairs (`item_features`)."""
    if len(solutions) == 0:
        raise ValueError("cannot fit a one-feature rule on no rows")
    table = pd.DataFrame([item_features(s) for s in solutions])
    y = labels.to_numpy().astype(int)
    best: Rule | None = None
    for feature in sorted(table.columns):
        values = table[feature].to_numpy()
        points = np.unique(values)
        cuts = np.concatenate([[points[0] - 1], (points[:-1] + points[1:]) / 2])
        for cut in cuts:
            for sign in (1, -1):
                accuracy = float(np.mean((sign * (values - cut) > 0).astype(int) == y))
                if best is None or accuracy > best.train_accuracy:
                    best = Rule(feature, float(cut), sign, accuracy)
    assert best is not None
    return best


def _reference_arm(base: pd.DataFrame, arm: str, p: pd.Series) -> pd.DataFrame:
    """The base episodes answered by a reference arm with P(accept) `p` (accept above 0.5)."""
    decision = (p > 0.5).astype("int64")
    return base.assign(
        arm=arm,
        iteration=0,
        decision=decision.astype("Int64"),
        correct=(decision == base["y"]).to_numpy(),
        decided=True,
        model_calls=0,
        tokens=0,
        p_accept=p.to_numpy(),
    )[list(EXPERIMENT_COLUMNS)]


def likelihood_rows(base: pd.DataFrame, likelihoods: pd.DataFrame) -> pd.DataFrame:
    """The likelihood baseline on the base episodes of pairs: accept Solution A when the base
    model's mean log-probability per token is higher for A than for B (P(accept) the logistic
    of the difference). Episodes of a pair without scores are left out."""
    per_token = likelihoods.set_index("datapoint_id")
    gap = per_token["logprob_first"] / per_token["tokens_first"].clip(lower=1) - per_token[
        "logprob_second"
    ] / per_token["tokens_second"].clip(lower=1)
    rows = base[base["datapoint_id"].isin(gap.index)]
    z = rows["datapoint_id"].map(gap).astype(float).clip(-700, 700)
    return _reference_arm(rows, LIKELIHOOD_ARM, 1.0 / (1.0 + np.exp(-z)))


def reference_rows(
    base: pd.DataFrame, solutions: dict[int, str | tuple[str, str]], rule: Rule
) -> pd.DataFrame:
    """Experiment rows of the reference arms on the base model's episodes (same datapoints,
    samples and labels; no model calls). `solutions` maps datapoint id -> code (a pair's:
    (Solution A, Solution B))."""
    scores = {d: rule.score(item_features(solutions[d])) for d in base["datapoint_id"].unique()}
    frames = []
    for arm in REFERENCE_ARMS:
        if arm == "one_feature_rule":
            p = base["datapoint_id"].map(scores).astype(float)
        else:
            p = pd.Series(1.0 if arm == "always_accept" else 0.0, index=base.index)
        frames.append(_reference_arm(base, arm, p))
    return pd.concat(frames, ignore_index=True)
