"""Experiment statistics: the columns of the per-episode rows and of the summary table.

The bootstrap behind every interval (datapoints resampled, seeded) is `nip_core.malt.bootstrap`;
the summary itself is `summary.py`. Pure: constants only.
"""

from __future__ import annotations

EXPERIMENT_COLUMNS = (
    "seed",
    "arm",
    "iteration",
    "datapoint_id",
    "sample",
    "decision",
    "y",
    "correct",
    "decided",
    "model_calls",
    "tokens",
    "p_accept",
)
SUMMARY_COLUMNS = (
    "scope",
    "seed",
    "arm",
    "iteration",
    "accuracy",
    "accuracy_ci_low",
    "accuracy_ci_high",
    "decision_rate",
    "accuracy_when_decided",
    "accept_rate",
    "auc",
    "auc_ci_low",
    "auc_ci_high",
    "accept_rate_flagged",
    "diff_vs_base",
    "diff_ci_low",
    "diff_ci_high",
    "train_model_calls",
    "wall_seconds",
)
# An accept rate outside this band is flagged: a verifier near one constant verdict.
ACCEPT_RATE_BAND = (0.2, 0.8)
