"""Mutation operators: each yields valid, minimal, correctly described source edits."""

from __future__ import annotations

import ast

from nip_core.data.mutants import enumerate_mutants
from nip_core.data.mutations import OPERATORS

PROMPT = '''def count_small(values: list, limit: int) -> int:
    """Count values below limit."""
'''
BODY = """    total = 0
    for i in range(len(values)):
        if values[i] < limit and values[i] != -1:
            total += 1
        else:
            total = total * 1
    return total
"""
SOURCE = PROMPT + BODY
FIRST_BODY_LINE = PROMPT.count("\n") + 1


def _changed_lines(mutated: str) -> list[tuple[str, str]]:
    """(old, new) pairs of lines that differ, when the line count is unchanged."""
    return [
        (a, b) for a, b in zip(SOURCE.splitlines(), mutated.splitlines(), strict=True) if a != b
    ]


def _by_description(fragment: str) -> list[str]:
    mutants = enumerate_mutants(SOURCE, FIRST_BODY_LINE)
    return [m.source for m in mutants if fragment in m.description]


def test_every_mutant_is_valid_distinct_and_keeps_the_prompt() -> None:
    mutants = enumerate_mutants(SOURCE, FIRST_BODY_LINE)
    original = ast.dump(ast.parse(SOURCE))
    assert len({m.source for m in mutants}) == len(mutants) > 15
    for mutant in mutants:
        assert mutant.source.startswith(PROMPT)
        assert ast.dump(ast.parse(mutant.source)) != original
        assert mutant.operator in OPERATORS
        assert mutant.description.rsplit(" at line ", 1)[1].isdigit()


def test_every_operator_fires_on_a_suitable_function() -> None:
    source = SOURCE + "\n\ndef g(a, b):\n    return not (a or b) and max(a - b, 0) > 1\n"
    operators = {m.operator for m in enumerate_mutants(source, FIRST_BODY_LINE)}
    assert operators == set(OPERATORS)


def test_comparison_flip_is_a_one_token_edit() -> None:
    (mutated,) = _by_description("compare: '<' -> '<='")
    assert _changed_lines(mutated) == [
        (
            "        if values[i] < limit and values[i] != -1:",
            "        if values[i] <= limit and values[i] != -1:",
        )
    ]


def test_off_by_one_on_range_and_index() -> None:
    sources = _by_description("off-by-one: range argument 1 +1")
    assert [new for _, new in _changed_lines(sources[0])] == [
        "    for i in range(len(values) + 1):"
    ]
    index_mutants = _by_description("off-by-one: index +1")
    assert any("if values[i + 1] < limit" in source for source in index_mutants)
    length = enumerate_mutants("def f(x):\n    return len(x)\n")
    assert {m.source.splitlines()[1] for m in length} >= {"    return len(x) - 1"}


def test_negative_literal_is_changed_as_a_whole() -> None:
    assert [new for _, new in _changed_lines(_by_description("constant: -1 -> -2")[0])] == [
        "        if values[i] < limit and values[i] != -2:"
    ]
    assert _by_description("constant: -1 -> 0")
    consts = enumerate_mutants("def f(x):\n    return x[-1]\n")
    assert {m.source.splitlines()[1] for m in consts} >= {"    return x[-2]", "    return x[0]"}


def test_dropped_else_removes_exactly_the_else_lines() -> None:
    (mutated,) = _by_description("removed the else/elif part")
    assert "else:" not in mutated and "total * 1" not in mutated
    assert len(mutated.splitlines()) == len(SOURCE.splitlines()) - 2


def test_precedence_is_kept_with_parentheses() -> None:
    mutants = enumerate_mutants("def f(a, b, c):\n    return c - a * b\n")
    swapped = [m for m in mutants if m.description.startswith("arithmetic: '*' -> '+'")]
    assert [m.source.splitlines()[1] for m in swapped] == ["    return c - (a + b)"]


def test_wrong_return_uses_another_local_name() -> None:
    sources = _by_description("return: 'total' -> 'i'")
    assert [new for _, new in _changed_lines(sources[0])] == ["    return i"]


def test_first_line_limits_where_mutations_happen() -> None:
    last_line = len(SOURCE.splitlines())
    mutants = enumerate_mutants(SOURCE, first_line=last_line)
    assert mutants and all(m.description.endswith(f"at line {last_line}") for m in mutants)
    assert all(m.source.splitlines()[:-1] == SOURCE.splitlines()[:-1] for m in mutants)


def test_docstrings_are_never_mutated() -> None:
    source = 'def f():\n    """doc"""\n    x = ""\n    return x\n'
    for mutant in enumerate_mutants(source):
        assert '"""doc"""' in mutant.source


def test_enumeration_is_deterministic() -> None:
    assert enumerate_mutants(SOURCE, FIRST_BODY_LINE) == enumerate_mutants(SOURCE, FIRST_BODY_LINE)
