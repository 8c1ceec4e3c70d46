"""Turn mutation proposals into mutated source code.

A mutant is made by editing only the target node's text in the original source (so comments,
docstrings and layout elsewhere are kept) and is accepted only if re-parsing the edited text gives
exactly the expected tree; where operator precedence would change the meaning, the replacement
is retried in parentheses.

Usage::

    mutants = enumerate_mutants(source, first_line=12)   # only mutate lines >= 12
    mutants[0].source, mutants[0].description            # "compare: '<' -> '<=' at line 14"
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping

from nip_core.data.mutations import OPERATORS, Mutant, Operator, wrong_return


def enumerate_mutants(
    source: str, first_line: int = 1, operators: Mapping[str, Operator] = OPERATORS
) -> list[Mutant]:
    """Every distinct valid mutant of `source` whose change starts at or after `first_line`.

    The order is deterministic (breadth-first over the tree, `operators` in their mapping order),
    so a seeded choice among the result is reproducible. `operators` defaults to `OPERATORS`.
    """
    tree = ast.parse(source)
    original_dump = ast.dump(tree)
    nodes = list(ast.walk(tree))
    parents = {id(child): node for node in nodes for child in ast.iter_child_nodes(node)}
    mutants: list[Mutant] = []
    seen = {source}
    for node in nodes:
        line = getattr(node, "lineno", 0)
        parent = parents.get(id(node))
        if line < first_line or parent is None:
            continue
        for name, replacement, description in _proposals(node, parent, tree, operators):
            mutated = _realise(source, tree, node, parent, replacement)
            if mutated is None or mutated in seen or ast.dump(ast.parse(mutated)) == original_dump:
                continue
            seen.add(mutated)
            mutants.append(Mutant(mutated, f"{description} at line {line}", name))
    return mutants


def _proposals(
    node: ast.AST, parent: ast.AST, tree: ast.AST, operators: Mapping[str, Operator]
) -> Iterator[tuple[str, ast.AST | None, str]]:
    """All operators' proposals for one node, tagged with the operator name."""
    for name, operator in operators.items():
        if operator is wrong_return:
            proposals = wrong_return(node, parent, _local_names(tree, node))
        else:
            proposals = operator(node, parent)
        for replacement, description in proposals:
            yield name, replacement, description


def _local_names(tree: ast.AST, node: ast.AST) -> tuple[str, ...]:
    """Parameters and assigned names of the innermost function around `node`, sorted."""
    if not isinstance(node, ast.Return):
        return ()
    enclosing = [
        func
        for func in ast.walk(tree)
        if isinstance(func, ast.FunctionDef) and func.lineno <= node.lineno <= func.end_lineno
    ]
    if not enclosing:
        return ()
    func = max(enclosing, key=lambda candidate: candidate.lineno)
    names = {arg.arg for arg in func.args.args}
    names |= {
        n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    return tuple(sorted(names))


def _realise(
    source: str, tree: ast.AST, node: ast.AST, parent: ast.AST, replacement: ast.AST | None
) -> str | None:
    """Edit `source` so that it parses to `tree` with `node` replaced; None when no edit does."""
    with _swapped_in(parent, node, replacement):
        expected = ast.dump(tree)
    for candidate in _candidate_edits(source, node, replacement):
        try:
            if ast.dump(ast.parse(candidate)) == expected:
                return candidate
        except SyntaxError:
            continue
    return None


class _swapped_in:
    """Context manager: put `new` (or nothing) where `old` sits in `parent`, then restore."""

    def __init__(self, parent: ast.AST, old: ast.AST, new: ast.AST | None) -> None:
        self.parent, self.old, self.new = parent, old, new
        self.restore: Callable[[], None] = lambda: None

    def __enter__(self) -> None:
        for field, value in ast.iter_fields(self.parent):
            if value is self.old:
                setattr(self.parent, field, self.new)
                self.restore = lambda f=field: setattr(self.parent, f, self.old)
                return
            if isinstance(value, list) and any(item is self.old for item in value):
                index = next(i for i, item in enumerate(value) if item is self.old)
                saved = list(value)
                value[index : index + 1] = [] if self.new is None else [self.new]
                self.restore = lambda v=value, s=saved: v.__setitem__(slice(None), s)
                return
        raise ValueError("node is not a child of the given parent")

    def __exit__(self, *exc: object) -> None:
        self.restore()


def _candidate_edits(source: str, node: ast.AST, replacement: ast.AST | None) -> Iterator[str]:
    """Text edits to try, least invasive first."""
    lines = source.splitlines(keepends=True)
    if replacement is None:
        yield _delete_lines(lines, node.lineno, node.end_lineno)
        return
    if isinstance(node, ast.If) and isinstance(replacement, ast.If) and not replacement.orelse:
        else_line = _else_line(lines, node)
        if else_line is not None:
            yield _delete_lines(lines, else_line, node.orelse[-1].end_lineno)
        return
    start = _char_offset(lines, node.lineno, node.col_offset)
    end = _char_offset(lines, node.end_lineno, node.end_col_offset)
    indent = lines[node.lineno - 1][
        : len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())
    ]
    text = ast.unparse(replacement).replace("\n", "\n" + indent)
    yield source[:start] + text + source[end:]
    if isinstance(replacement, ast.expr):
        yield source[:start] + "(" + text + ")" + source[end:]


def _delete_lines(lines: list[str], first: int, last: int) -> str:
    """The source without lines `first..last` (1-based, inclusive)."""
    return "".join(lines[: first - 1] + lines[last:])


def _else_line(lines: list[str], node: ast.If) -> int | None:
    """1-based line of the `else:`/`elif` that opens `node.orelse`, if it starts its own line."""
    for number in range(node.body[-1].end_lineno + 1, node.orelse[0].lineno + 1):
        if lines[number - 1].lstrip().startswith(("else", "elif")):
            return number
    return None


def _char_offset(lines: list[str], lineno: int, col_offset: int) -> int:
    """Character offset in the whole source of an AST position (whose column counts UTF-8 bytes)."""
    column = len(lines[lineno - 1].encode("utf-8")[:col_offset].decode("utf-8"))
    return sum(len(line) for line in lines[: lineno - 1]) + column
