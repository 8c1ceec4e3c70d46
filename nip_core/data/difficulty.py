"""Bug difficulty grades of humaneval-buggy: how visible the buggy solution's bug is.

`dataset_options.difficulty` picks, for every problem, which buggy solution goes with the
canonical one:

* "mixed" (the default): the original dataset, bit for bit. The first failing mutant in a seeded
  order over all `OPERATORS`, so the bugs are a mix of medium and (mostly) hard ones.
* "easy": the entry point's whole body replaced by a stub (`pass`, `return None`, `return 0`,
  `return False`, `return ""` or `return []`); the function visibly computes nothing.
* "medium": one visible change of logic: an arithmetic operator swapped (`+` -> `-`), a
  condition inverted (`==` -> `!=`, `in` -> `not in`, `True` -> `False`), `and`/`or` swapped
  or a `not` dropped, the opposite function called (`min` -> `max`, `upper` -> `lower`,
  `append` -> `remove`), another variable or the negated condition returned, an else branch or
  if-statement dropped, or a whole statement (assignment, call, return, loop) dropped.
* "hard": one subtle change: an index, slice bound or range bound off by one, a number changed
  by one or a one-character string changed, a comparison relaxed (`<` -> `<=`), call arguments
  or operands swapped, or a near-synonym called (`strip` -> `lstrip`, `sorted` -> `list`,
  `sum` -> `len`, `find` -> `rfind`).

The graded variants must fail the tests by an error or a failed assertion; a timeout or a
resource limit does not count, so that whether a variant fails does not depend on machine speed.
See docs/data_difficulty.md for counts and examples.
"""

from __future__ import annotations

import ast
from typing import Any

from nip_core.data.mutations import EXTRA_OPERATORS, OPERATORS, Mutant, Operator

DIFFICULTIES: tuple[str, ...] = ("mixed", "easy", "medium", "hard")
DEFAULT_DIFFICULTY = "mixed"
OPTION = "dataset_options.difficulty"

STUB_OPERATOR = "stub"
STUB_BODIES: tuple[str, ...] = (
    "pass",
    "return None",
    "return 0",
    "return False",
    'return ""',
    "return []",
)
# Operators all of whose mutants are medium; the other operators' mutants are hard unless their
# change is one of MEDIUM_CHANGES (an inversion of the meaning rather than a near miss).
MEDIUM_OPERATORS: tuple[str, ...] = (
    "arithmetic",
    "boolean",
    "wrong_return",
    "dropped_branch",
    "dropped_statement",
)
MEDIUM_CHANGES: frozenset[str] = frozenset(
    {
        # a comparison inverted (relaxing one, '<' -> '<=', is hard)
        "compare: '==' -> '!='", "compare: '!=' -> '=='", "compare: 'in' -> 'not in'",
        "compare: 'not in' -> 'in'", "compare: 'is' -> 'is not'", "compare: 'is not' -> 'is'",
        # a boolean flipped (changing a number by one is hard)
        "constant: True -> False", "constant: False -> True",
        # the opposite function called (a near-synonym, 'strip' -> 'lstrip', is hard)
        "wrong function: 'min' -> 'max'", "wrong function: 'max' -> 'min'",
        "wrong function: 'any' -> 'all'", "wrong function: 'all' -> 'any'",
        "wrong function: 'upper' -> 'lower'", "wrong function: 'lower' -> 'upper'",
        "wrong function: 'isupper' -> 'islower'", "wrong function: 'islower' -> 'isupper'",
        "wrong function: 'isdigit' -> 'isalpha'", "wrong function: 'isalpha' -> 'isdigit'",
        "wrong function: 'startswith' -> 'endswith'",
        "wrong function: 'endswith' -> 'startswith'", "wrong function: 'append' -> 'remove'",
    }
)  # fmt: skip


def check_difficulty(value: Any) -> str:
    """`value` if it names a grade; otherwise a ValueError naming the option and the grades."""
    if not isinstance(value, str) or value not in DIFFICULTIES:
        raise ValueError(
            f"{OPTION} must be one of {DIFFICULTIES} (default {DEFAULT_DIFFICULTY!r}), "
            f"got {value!r}"
        )
    return value


def mutant_difficulty(mutant: Mutant) -> str | None:
    """'easy' for a stub; 'medium' for a mutant of MEDIUM_OPERATORS or one of MEDIUM_CHANGES;
    'hard' for any other mutant of OPERATORS; None for an unknown operator."""
    if mutant.operator == STUB_OPERATOR:
        return "easy"
    change = mutant.description.rsplit(" at line ", 1)[0]
    if mutant.operator in MEDIUM_OPERATORS or change in MEDIUM_CHANGES:
        return "medium"
    return "hard" if mutant.operator in OPERATORS else None


def all_operators() -> dict[str, Operator]:
    """Every operator, the extra ones included, in a fixed order: any can make a medium mutant."""
    return {**OPERATORS, **EXTRA_OPERATORS}


def stub_mutants(prompt: str, entry_point: str) -> list[Mutant]:
    """`prompt` (signature and docstring of `entry_point`) followed by each stub body.

    Raises ValueError when the prompt does not end inside `entry_point`, where a stub could not
    become its body.
    """
    tree = ast.parse(prompt)
    function = tree.body[-1] if tree.body else None
    if not isinstance(function, ast.FunctionDef) or function.name != entry_point:
        raise ValueError(f"the prompt does not end with the definition of {entry_point!r}")
    indent = " " * function.body[-1].col_offset
    head = prompt if prompt.endswith("\n") else prompt + "\n"
    mutants = []
    for body in STUB_BODIES:
        source = f"{head}{indent}{body}\n"
        stubbed = ast.parse(source).body[-1]
        if not isinstance(stubbed, ast.FunctionDef) or len(stubbed.body) != len(function.body) + 1:
            raise ValueError(f"a stub body does not fit the prompt of {entry_point!r}")
        mutants.append(Mutant(source, f"stub: body replaced by '{body}'", STUB_OPERATOR))
    return mutants
