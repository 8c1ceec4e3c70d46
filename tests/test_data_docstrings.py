"""`dataset_options.solution_docstring: dropped`: the solution without the docstrings it repeats
from its question, and nothing else of it changed."""

from __future__ import annotations

import ast

import pytest

from nip_core.data.docstrings import repeated_docstring_lines, without_repeated_docstrings
from nip_core.data.loaders import load_dataset
from nip_core.data.splits import load_split
from nip_core.parameters import HyperParameters

QUESTION = '''from typing import List


def halves(values: List[int]) -> List[int]:
    """ Halve every value.
    >>> halves([2, 4])
    [1, 2]
    """
'''
BODY = "    return [value // 2 for value in values]\n"


def test_the_repeated_docstring_goes_and_the_code_stays() -> None:
    solution = QUESTION + BODY
    shown = without_repeated_docstrings(QUESTION, solution)
    assert shown == (
        "from typing import List\n\n\n"
        "def halves(values: List[int]) -> List[int]:\n"
        "    return [value // 2 for value in values]\n"
    )
    namespace: dict[str, object] = {}
    exec(shown, namespace)  # noqa: S102 - our own literal
    assert namespace["halves"]([2, 4]) == [1, 2]  # type: ignore[operator]
    assert repeated_docstring_lines(QUESTION, solution) == {4, 5, 6, 7}


def test_a_docstring_the_question_does_not_hold_stays() -> None:
    solution = QUESTION.replace("Halve every value.", "Halve each value.") + BODY
    assert without_repeated_docstrings(QUESTION, solution) == solution


def test_a_docstring_that_is_the_whole_body_stays() -> None:
    # Dropping it would leave a function without a body.
    assert without_repeated_docstrings(QUESTION, QUESTION) == QUESTION


def test_a_docstring_sharing_its_line_with_code_stays() -> None:
    question = 'def one():\n    """One."""\n'
    solution = 'def one():\n    """One."""; return 1\n'
    assert without_repeated_docstrings(question, solution) == solution


def test_a_body_of_repeated_strings_only_stays() -> None:
    question = 'def two():\n    """Two."""\n    "Really two."\n'
    assert without_repeated_docstrings(question, question) == question


def test_code_after_a_docstring_with_wide_characters_is_seen() -> None:
    # ast counts columns in UTF-8 bytes: each "é" is two, so counting characters would read
    # past "; f()" and take the line for the docstring's alone.
    question = 'def name():\n    """ééééé"""\n'
    solution = 'def name():\n    """ééééé"""; f()\n    return 1\n'
    assert without_repeated_docstrings(question, solution) == solution
    plain = 'def name():\n    """ééééé"""\n    return 1\n'
    assert without_repeated_docstrings(question, plain) == "def name():\n    return 1\n"


def test_lines_are_counted_as_the_parser_counts_them() -> None:
    # A form feed inside a string literal is no line break to Python (str.splitlines splits).
    question = 'def ff():\n    """Feed."""\n'
    solution = 'def ff():\n    s = "a\x0cb"\n    """Feed."""\n    return s\n'
    assert without_repeated_docstrings(question, solution) == (
        'def ff():\n    s = "a\x0cb"\n    return s\n'
    )


def test_a_repeated_string_after_an_import_goes_too() -> None:
    question = 'def ceil_all(xs):\n    """Round every value up."""\n'
    solution = (
        "def ceil_all(xs):\n    import math\n"
        '    """Round every value up."""\n    return [math.ceil(x) for x in xs]\n'
    )
    assert without_repeated_docstrings(question, solution) == (
        "def ceil_all(xs):\n    import math\n    return [math.ceil(x) for x in xs]\n"
    )


def test_source_that_does_not_parse_is_shown_as_it_is() -> None:
    solution = QUESTION + "    return [value // 2 for value in\n"
    assert without_repeated_docstrings(QUESTION, solution) == solution


def test_the_dropped_option_shortens_every_humaneval_solution_and_keeps_the_rows() -> None:
    kept = load_dataset("humaneval-buggy", "test", bug_difficulty="easy")
    dropped = load_dataset(
        "humaneval-buggy", "test", bug_difficulty="easy", solution_docstring="dropped"
    )
    assert dropped.drop(columns="solution").equals(kept.drop(columns="solution"))
    for question, before, after in zip(
        kept["question"], kept["solution"], dropped["solution"], strict=True
    ):
        ast.parse(after)
        assert len(after) < len(before)
        docstring = ast.get_docstring(ast.parse(question).body[-1], clean=False)
        assert docstring is not None and docstring in before and docstring not in after
    # The shipped file's buggy rows keep their bug: the stub body is still there.
    buggy = dropped[dropped["y"] == 0]
    assert all(
        body.strip() in shown
        for body, shown in zip(
            kept.loc[buggy.index, "solution"].map(lambda s: s.splitlines()[-1]),
            buggy["solution"],
            strict=True,
        )
    )


def test_other_choices_are_refused() -> None:
    with pytest.raises(ValueError, match="solution_docstring"):
        load_dataset("humaneval-buggy", "test", solution_docstring="short")


def test_the_setting_reaches_the_stages_splits() -> None:
    hp = HyperParameters.from_dict(
        {
            "scenario": "code_validation",
            "trainer": "pure_text_malt",
            "dataset": "humaneval-buggy",
            "dataset_options": {"difficulty": "easy", "solution_docstring": "dropped"},
            "text_rl": {"validation_fraction": 0.2},
        }
    )
    shown = load_split(hp, "validation")
    assert all(
        question.rstrip() not in solution
        for question, solution in zip(shown["question"], shown["solution"], strict=True)
    )
