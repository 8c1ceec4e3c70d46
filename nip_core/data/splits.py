"""Dataset splits as the stages see them: train, a validation split carved from it, test.

For the pairwise protocol every split holds solution pairs (`nip_core.data.pairwise`), built
before the validation cut and before the control's label shuffle.

`text_rl.validation_fraction` of the train split's problems (all rows of a problem together, so
a correct and a buggy solution of one problem never straddle the cut) is set aside, seeded by
the run seed: the trainer never sees them, and evaluations on `validation` (hyper-parameter
sweeps, the switch guard) measure on them, keeping the test split for the final report.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nip_core.data import load_for_parameters
from nip_core.data.pairwise import pairwise_frame, shows_pairs
from nip_core.data.stable import stable_fraction, stable_seed
from nip_core.parameters.loading import apply_overrides

SPLITS: tuple[str, ...] = ("test", "train", "validation")


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def validation_mask(frame: pd.DataFrame, fraction: float, seed: int) -> pd.Series:
    """True for the rows whose problem falls into the validation share (stable per problem)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"text_rl.validation_fraction must be in [0, 1), got {fraction}")
    key = frame["problem_id"] if "problem_id" in frame.columns else frame["id"]
    draws = key.map(lambda problem: stable_fraction("validation", seed, problem))
    return draws < fraction


def load_split(hp, split: str) -> pd.DataFrame:
    """The rows of `split` for a configuration, with the validation problems carved out of train."""
    check_split(split)
    source = "test" if split == "test" else "train"
    frame = load_for_parameters(
        hp.dataset,
        source,
        options=hp.dataset_options,
        code_validation=hp.code_validation,
        seed=hp.seed,
    )
    if shows_pairs(hp.interaction_protocol):  # before the cut: a question's pairs stay together
        frame = pairwise_frame(frame)
    if split == "test":
        return frame
    fraction = hp.text_rl.validation_fraction
    if split == "validation" and fraction == 0:
        raise ValueError(
            "the validation split is empty: set text_rl.validation_fraction (e.g. 0.2) to carve "
            "one from the train split"
        )
    mask = validation_mask(frame, fraction, hp.seed)
    frame = frame[mask if split == "validation" else ~mask].reset_index(drop=True)
    if split == "train" and hp.text_rl.shuffle_training_labels:
        frame = shuffled_labels(frame, hp.seed)
    return frame


def true_training_labels(hp) -> dict[object, int]:
    """Each train row's own label (`id` -> `y`) before the control's shuffle: the control's
    pairs are balanced on it (`nip_core.malt.tree_values.balance_pairs_by_label`)."""
    frame = load_split(apply_overrides(hp, ["text_rl.shuffle_training_labels=false"]), "train")
    return dict(zip(frame["id"].tolist(), frame["y"].astype(int).tolist(), strict=True))


def shuffled_labels(frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The rows with their labels `y` permuted (seeded): the shuffled-label control arm trains
    on these, so any skill it shows beyond chance leaked from somewhere other than the labels."""
    order = np.random.default_rng(stable_seed("shuffle-labels", seed)).permutation(len(frame))
    return frame.assign(y=frame["y"].to_numpy()[order])
