"""Scenario and dataset parameters for code validation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nip_core.parameters.base import BaseParameters, register_parameter_class


@register_parameter_class
@dataclass(frozen=True)
class CodeValidationParameters(BaseParameters):
    """Which APPS problems and solutions the code-validation datasets use."""

    apps_difficulty: Literal["introductory", "interview", "competition"] = "interview"
    apps_solution_number: int = 0
    apps_exclude_flagged: bool = True


@register_parameter_class
@dataclass(frozen=True)
class DatasetParameters(BaseParameters):
    """Size limits, source and bug difficulty of the dataset.

    `max_train_size`/`max_test_size` cut the splits after a shuffle seeded with
    `reduce_shuffle_seed`; `local_path` points at a local copy (no downloads at run time).
    `difficulty` picks humaneval-buggy's buggy solutions by how visible the bug is: "mixed" (the
    original dataset, unchanged), "easy" (body replaced by a stub such as `return None`),
    "medium" (a swapped operator, inverted comparison or dropped statement) or "hard" (off by
    one, changed literal, relaxed comparison, swapped arguments); other datasets take only
    "mixed". See docs/data_difficulty.md. `solution_docstring: dropped` shows each solution
    without the docstrings it repeats from its question (a shorter prompt: about two thirds of
    humaneval-buggy's solution text goes), "kept" (the default) as it is.
    `train_extra_difficulty` adds another grade's buggy solutions of the same train problems to
    the train split alone (pairwise protocols): a problem then gives a contrast per grade where
    one grade gives one; validation and test keep `difficulty`'s pairs only.
    """

    max_train_size: int | None = None
    max_test_size: int | None = None
    reduce_shuffle_seed: int = 42
    local_path: str | None = None
    difficulty: Literal["mixed", "easy", "medium", "hard"] = "mixed"
    solution_docstring: Literal["kept", "dropped"] = "kept"
    train_extra_difficulty: Literal["mixed", "easy", "medium", "hard"] | None = None
