"""Dataset splits as the stages see them: train, a validation split carved from it, test.

For the pairwise protocol every split holds solution pairs (`nip_core.data.pairwise`), built
before the validation cut and before the control's label shuffle. With
`dataset_options.train_extra_difficulty` the train split also holds another grade's pairs of the
same problems; validation and test never do.

`text_rl.validation_fraction` of the train split's problems (all rows of a problem together, so
a correct and a buggy solution of one problem never straddle the cut) is set aside, seeded by
the run seed: the trainer never sees them, and evaluations on `validation` (hyper-parameter
sweeps, the switch guard) measure on them, keeping the test split for the final report.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from nip_core.data import load_for_parameters
from nip_core.data.pairwise import pairwise_frame
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
    frame = load_grade(hp, source, hp.dataset_options.difficulty)
    if split == "test":
        return frame
    fraction = hp.text_rl.validation_fraction
    if split == "validation" and fraction == 0:
        raise ValueError(
            "the validation split is empty: set text_rl.validation_fraction (e.g. 0.2) to carve "
            "one from the train split"
        )
    extra = hp.dataset_options.train_extra_difficulty
    if split == "train" and extra is not None:
        frame = pooled_pairs(frame, load_grade(hp, "train", extra))
    mask = validation_mask(frame, fraction, hp.seed)
    frame = frame[mask if split == "validation" else ~mask].reset_index(drop=True)
    if split == "train" and hp.text_rl.shuffle_training_labels:
        frame = shuffled_labels(frame, hp.seed)
    return frame


def load_grade(hp, source: str, difficulty: str) -> pd.DataFrame:
    """One grade's rows of the dataset's train or test source, as pairs where the protocol shows
    pairs (built before the validation cut: a question's pairs stay together)."""
    options = dataclasses.replace(hp.dataset_options, difficulty=difficulty)
    frame = load_for_parameters(
        hp.dataset, source, options=options, code_validation=hp.code_validation, seed=hp.seed
    )
    return pairwise_frame(frame) if hp.shows_pairs else frame


def pooled_pairs(pairs: pd.DataFrame, extra_pairs: pd.DataFrame) -> pd.DataFrame:
    """`pairs` with another grade's pairs of the same problems, sorted by id; an extra pair
    showing the very solutions a first-grade pair shows is left out, so no contrast counts
    twice. Pair ids stay unique: each grade's buggy rows have their own ids."""
    shown = ["problem_id", "solution", "other_solution"]
    seen = pd.MultiIndex.from_frame(pairs[shown])
    extra_pairs = extra_pairs[~pd.MultiIndex.from_frame(extra_pairs[shown]).isin(seen)]
    pooled = pd.concat([pairs, extra_pairs], ignore_index=True)
    if pooled["id"].duplicated().any():
        raise ValueError("pooled grades share a pair id: the dataset file's ids are not unique")
    return pooled.sort_values("id", kind="stable").reset_index(drop=True)


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
