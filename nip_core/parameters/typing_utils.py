"""Reading field annotations at run time: unions, Literals and "does this value fit".

The parameter classes declare their contract in their annotations; validation, `from_dict` and
command-line overrides all read it from here so the rules live in one place.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Literal, Union

NoneType = type(None)


@functools.cache
def field_hints(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass's fields (cached: classes don't change)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def union_members(annotation: Any) -> tuple[Any, ...]:
    """The alternatives of `X | Y | None` (a non-union is its own single member)."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def literal_values(annotation: Any) -> tuple[Any, ...] | None:
    """The allowed values if some member of the annotation is a Literal, else None."""
    values: list[Any] = []
    for member in union_members(annotation):
        if typing.get_origin(member) is Literal:
            values.extend(typing.get_args(member))
    return tuple(values) if values else None


def is_optional(annotation: Any) -> bool:
    """Whether None is an allowed value."""
    return any(m is NoneType or m is None for m in union_members(annotation))


def classes_in(annotation: Any, base: type) -> list[type]:
    """The members of the annotation that are subclasses of `base`."""
    return [m for m in union_members(annotation) if isinstance(m, type) and issubclass(m, base)]


def describe(annotation: Any) -> str:
    """A short human description of an annotation for error messages."""
    parts = []
    for member in union_members(annotation):
        if typing.get_origin(member) is Literal:
            parts.append("one of " + ", ".join(repr(v) for v in typing.get_args(member)))
        elif member is NoneType or member is None:
            parts.append("None")
        elif member is Any:
            parts.append("any value")
        else:
            parts.append(getattr(member, "__name__", str(member)))
    return " | ".join(parts)


def _matches_member(value: Any, member: Any) -> bool:
    if member is Any:
        return True
    if member is NoneType or member is None:
        return value is None
    if typing.get_origin(member) is Literal:
        return any(type(value) is type(v) and value == v for v in typing.get_args(member))
    if member is bool:
        return isinstance(value, bool)
    if member is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if member is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    origin = typing.get_origin(member)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(member, type) and isinstance(value, member)


def matches(value: Any, annotation: Any) -> bool:
    """Whether `value` is allowed by `annotation` (bool is never accepted as a number)."""
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return any(_matches_member(value, m) for m in union_members(annotation))


def accepts_float(annotation: Any) -> bool:
    """Whether the annotation takes floats, so an int given for it should become a float."""
    return float in union_members(annotation)
