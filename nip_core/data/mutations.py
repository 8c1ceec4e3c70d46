"""Small program mutations that turn a correct solution into a plausible buggy one.

Each operator looks at one AST node (and its parent) and proposes replacement nodes with a short
description; `nip_core.data.mutants.enumerate_mutants` turns proposals into source edits.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from dataclasses import dataclass

_BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mod,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.BitXor: ast.BitAnd,
}
_COMPARE_SWAPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
# Functions and methods that are easily confused with each other.
_NAME_SWAPS: dict[str, str] = {
    "min": "max", "max": "min", "any": "all", "all": "any", "sorted": "list", "sum": "len",
    "upper": "lower", "lower": "upper", "swapcase": "lower", "isupper": "islower",
    "islower": "isupper", "isdigit": "isalpha", "isalpha": "isdigit", "startswith": "endswith",
    "endswith": "startswith", "strip": "lstrip", "lstrip": "rstrip", "rstrip": "lstrip",
    "find": "rfind", "rfind": "find", "index": "count", "md5": "sha1", "ceil": "floor",
    "floor": "ceil", "append": "remove", "isinstance": "issubclass",
}  # fmt: skip
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)

# (expected replacement node or None to delete a statement, description without location)
Proposal = tuple[ast.AST | None, str]
Operator = Callable[[ast.AST, ast.AST], list[Proposal]]


@dataclass(frozen=True)
class Mutant:
    """A mutated program and what was changed."""

    source: str
    description: str
    operator: str


def _sym(node: ast.AST) -> str:
    """Source spelling of an operator node, e.g. '<=' for ast.LtE."""
    return {
        ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
        ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&",
        ast.BitOr: "|", ast.BitXor: "^", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
        ast.Eq: "==", ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is",
        ast.IsNot: "is not", ast.And: "and", ast.Or: "or",
    }[type(node)]  # fmt: skip


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)
    )


def _int_value(node: ast.AST) -> int | None:
    """The value of an int literal, including a negated one such as `-1`; None otherwise."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_value(node.operand)
        return None if inner is None else -inner
    return None


def _int_node(value: int) -> ast.expr:
    return ast.Constant(value) if value >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-value))


def _shifted(node: ast.expr, delta: int) -> ast.expr:
    """`node + delta` (folded into the literal when `node` is an int literal)."""
    value = _int_value(node)
    if value is not None:
        return _int_node(value + delta)
    op = ast.Add() if delta > 0 else ast.Sub()
    return ast.BinOp(copy.deepcopy(node), op, ast.Constant(abs(delta)))


def arithmetic(node: ast.AST, _parent: ast.AST) -> list[Proposal]:
    """Swap an arithmetic/bitwise operator (not on string operands)."""
    if isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _BINOP_SWAPS:
        operands = (node.left, node.right) if isinstance(node, ast.BinOp) else (node.value,)
        if any(_is_text(operand) for operand in operands):
            return []
        new = copy.deepcopy(node)
        new.op = _BINOP_SWAPS[type(node.op)]()
        return [(new, f"arithmetic: '{_sym(node.op)}' -> '{_sym(new.op)}'")]
    return []


def boolean(node: ast.AST, _parent: ast.AST) -> list[Proposal]:
    """Swap `and`/`or`, or drop a `not`."""
    if isinstance(node, ast.BoolOp):
        new = copy.deepcopy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        return [(new, f"boolean: '{_sym(node.op)}' -> '{_sym(new.op)}'")]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return [(copy.deepcopy(node.operand), "boolean: dropped 'not'")]
    return []


def compare(node: ast.AST, _parent: ast.AST) -> list[Proposal]:
    """Flip or relax one comparison operator of a (possibly chained) comparison."""
    if not isinstance(node, ast.Compare):
        return []
    proposals: list[Proposal] = []
    for index, op in enumerate(node.ops):
        new = copy.deepcopy(node)
        new.ops[index] = _COMPARE_SWAPS[type(op)]()
        proposals.append((new, f"compare: '{_sym(op)}' -> '{_sym(new.ops[index])}'"))
    return proposals


def off_by_one(node: ast.AST, _parent: ast.AST) -> list[Proposal]:
    """Shift a range() bound, a subscript index or a slice bound by one."""
    proposals: list[Proposal] = []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
        for index, arg in enumerate(node.args[:2]):
            for delta in (1, -1):
                new = copy.deepcopy(node)
                new.args[index] = _shifted(arg, delta)
                proposals.append((new, f"off-by-one: range argument {index + 1} {delta:+d}"))
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        for field in ("lower", "upper"):
            bound = getattr(node.slice, field)
            for delta in (1, -1) if bound is not None else ():
                new = copy.deepcopy(node)
                setattr(new.slice, field, _shifted(bound, delta))
                proposals.append((new, f"off-by-one: slice {field} bound {delta:+d}"))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
        for delta in (1, -1):
            proposals.append((_shifted(node, delta), f"off-by-one: len(...) {delta:+d}"))
    elif isinstance(node, ast.Subscript) and (
        _int_value(node.slice) is not None or isinstance(node.slice, ast.Name)
    ):
        for delta in (1, -1):
            new = copy.deepcopy(node)
            new.slice = _shifted(node.slice, delta)
            proposals.append((new, f"off-by-one: index {delta:+d}"))
    return proposals


def constant(node: ast.AST, parent: ast.AST) -> list[Proposal]:
    """Change an int literal by one or flip a bool literal (indices are left to off_by_one)."""
    if isinstance(parent, ast.Subscript | ast.UnaryOp):
        return []
    negative = _int_value(node) if isinstance(node, ast.UnaryOp) else None
    if negative is not None:
        values = (negative + 1, negative - 1)
        return [(_int_node(value), f"constant: {negative} -> {value}") for value in values]
    if not isinstance(node, ast.Constant):
        return []
    if isinstance(node.value, bool):
        return [(ast.Constant(not node.value), f"constant: {node.value} -> {not node.value}")]
    if type(node.value) in (int, float):
        values = [node.value + 1] + ([node.value - 1] if node.value > 0 else [])
        return [(ast.Constant(value), f"constant: {node.value!r} -> {value!r}") for value in values]
    if isinstance(node.value, str) and len(node.value) <= 1 and not isinstance(parent, ast.Expr):
        if isinstance(parent, ast.JoinedStr):
            return []
        value = " " if node.value == "" else ""
        return [(ast.Constant(value), f"constant: {node.value!r} -> {value!r}")]
    return []


def wrong_return(node: ast.AST, _parent: ast.AST, names: tuple[str, ...] = ()) -> list[Proposal]:
    """Return another local variable, or negate a boolean-looking return value."""
    if not isinstance(node, ast.Return) or node.value is None:
        return []
    value = node.value
    if isinstance(value, ast.Name):
        others = [name for name in names if name != value.id][:2]
        return [
            (ast.Return(ast.Name(other, ast.Load())), f"return: '{value.id}' -> '{other}'")
            for other in others
        ]
    if isinstance(value, ast.Compare | ast.BoolOp) or (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
        and value.func.id in ("all", "any", "bool", "isinstance")
    ):  # fmt: skip
        negated = ast.Return(ast.UnaryOp(ast.Not(), copy.deepcopy(value)))
        return [(negated, "return: negated the returned condition")]
    return []


def dropped_branch(node: ast.AST, parent: ast.AST) -> list[Proposal]:
    """Remove an else/elif part, or a whole if-statement that has no else and has siblings."""
    comprehensions = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
    if isinstance(node, comprehensions) and node.generators[-1].ifs:
        new = copy.deepcopy(node)
        new.generators[-1].ifs.pop()
        return [(new, "dropped branch: removed a comprehension filter")]
    if not isinstance(node, ast.If):
        return []
    if node.orelse:
        new = copy.deepcopy(node)
        new.orelse = []
        return [(new, "dropped branch: removed the else/elif part")]
    siblings = next(
        (body for _, body in ast.iter_fields(parent) if isinstance(body, list) and node in body),
        [],
    )
    return [(None, "dropped branch: removed an if-statement")] if len(siblings) > 1 else []


def swapped(node: ast.AST, _parent: ast.AST) -> list[Proposal]:
    """Swap the first two positional call arguments, or the operands of a non-commutative op."""
    if isinstance(node, ast.Call) and len(node.args) >= 2:
        if any(isinstance(arg, ast.Starred) for arg in node.args[:2]):
            return []
        new = copy.deepcopy(node)
        new.args[0], new.args[1] = new.args[1], new.args[0]
        return [(new, "swap: arguments 1 and 2 of a call")]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In):
        new = copy.deepcopy(node)
        new.left, new.comparators[0] = new.comparators[0], new.left
        return [(new, "swap: operands of 'in'")]
    if isinstance(node, ast.BinOp) and isinstance(node.op, _NON_COMMUTATIVE):
        new = copy.deepcopy(node)
        new.left, new.right = new.right, new.left
        return [(new, f"swap: operands of '{_sym(node.op)}'")]
    return []


def wrong_function(node: ast.AST, _parent: ast.AST) -> list[Proposal]:
    """Call a similar but different function or method (min/max, upper/lower, ...)."""
    if not isinstance(node, ast.Call):
        return []
    func = node.func
    old = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if old not in _NAME_SWAPS:
        return []
    new = copy.deepcopy(node)
    if isinstance(new.func, ast.Name):
        new.func.id = _NAME_SWAPS[old]
    else:
        new.func.attr = _NAME_SWAPS[old]
    return [(new, f"wrong function: '{old}' -> '{_NAME_SWAPS[old]}'")]


_DROPPABLE: dict[type[ast.stmt], str] = {
    ast.Assign: "an assignment",
    ast.AugAssign: "an augmented assignment",
    ast.AnnAssign: "an assignment",
    ast.Return: "a return statement",
    ast.For: "a for loop",
    ast.While: "a while loop",
    ast.Expr: "a call statement",
}


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def dropped_statement(node: ast.AST, parent: ast.AST) -> list[Proposal]:
    """Remove one assignment, call statement, return or loop whose block keeps another statement
    besides a docstring (emptying a function body is a stub, not a dropped statement)."""
    what = _DROPPABLE.get(type(node))
    if what is None or _is_docstring(node):
        return []
    siblings = next(
        (body for _, body in ast.iter_fields(parent) if isinstance(body, list) and node in body),
        [],
    )
    rest = [other for other in siblings if other is not node and not _is_docstring(other)]
    return [(None, f"dropped statement: removed {what}")] if rest else []


OPERATORS: dict[str, Operator] = {
    "arithmetic": arithmetic,
    "boolean": boolean,
    "compare": compare,
    "off_by_one": off_by_one,
    "constant": constant,
    "wrong_return": wrong_return,
    "dropped_branch": dropped_branch,
    "swapped": swapped,
    "wrong_function": wrong_function,
}

# Operators used only by the graded variants (see `nip_core.data.difficulty`). They are kept out of
# OPERATORS so that the mixed grade, whose seeded order depends on the operator set, is unchanged.
EXTRA_OPERATORS: dict[str, Operator] = {"dropped_statement": dropped_statement}
