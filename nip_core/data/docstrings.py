"""Show a solution without the docstrings it repeats from its question.

Every humaneval-buggy solution starts with its question (imports, signature and docstring), so the
verifier reads the docstring twice: 28 % of its prompt on the easy grade, and a DPO step's cost
grows with the prompt. `dataset_options.solution_docstring: dropped` removes, from the solution,
each function docstring whose source also appears in the question; the signature, the body and
every other line stay as they were, so the code still parses and runs.
"""

from __future__ import annotations

import ast
import re

SOLUTION_DOCSTRING_CHOICES: tuple[str, ...] = ("kept", "dropped")
DEFAULT_SOLUTION_DOCSTRING = "kept"
OPTION = "dataset_options.solution_docstring"


def check_solution_docstring(choice: str) -> None:
    if choice not in SOLUTION_DOCSTRING_CHOICES:
        raise ValueError(f"{OPTION} must be one of {SOLUTION_DOCSTRING_CHOICES}, got {choice!r}")


def source_lines(source: str) -> list[str]:
    """`source`'s lines with their endings, split where Python's parser splits them (str's
    `splitlines` also splits at form feeds and other separators inside a line)."""
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", source)


def repeated_docstring_lines(question: str, solution: str) -> set[int]:
    """The 0-based lines of `solution` taken by docstrings that `question` repeats.

    A docstring here is a bare string statement in a function's body (usually its first; in
    HumanEval/115 it follows an import). It counts only if it fills its own lines, and only
    while its function keeps another statement; source that does not parse has none.
    """
    try:
        tree = ast.parse(solution)
    except SyntaxError:
        return set()
    lines = source_lines(solution)
    dropped: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        repeated = [
            statement
            for statement in node.body
            if owns_repeated_lines(statement, question, solution, lines)
        ]
        if len(repeated) == len(node.body):
            continue  # the function would be left without a body
        for statement in repeated:
            dropped.update(range(statement.lineno - 1, statement.end_lineno or statement.lineno))
    return dropped


def owns_repeated_lines(
    statement: ast.stmt, question: str, solution: str, lines: list[str]
) -> bool:
    """Whether `statement` is a string that `question` repeats, alone on its lines."""
    if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)):
        return False
    if not isinstance(statement.value.value, str) or statement.end_lineno is None:
        return False
    segment = ast.get_source_segment(solution, statement)
    if not segment or segment not in question or statement.end_col_offset is None:
        return False
    # ast's column offsets count UTF-8 bytes, not characters.
    before = lines[statement.lineno - 1].encode()[: statement.col_offset]
    after = lines[statement.end_lineno - 1].encode()[statement.end_col_offset :]
    return before.strip() == b"" and after.strip() == b""


def without_repeated_docstrings(question: str, solution: str) -> str:
    """`solution` with the lines of the docstrings its question repeats removed."""
    dropped = repeated_docstring_lines(question, solution)
    if not dropped:
        return solution
    kept = [line for number, line in enumerate(source_lines(solution)) if number not in dropped]
    return "".join(kept)
