"""The machinery shared by every parameter class: registry, to_dict/from_dict, dotted get.

Every parameter class is a frozen dataclass deriving from `BaseParameters`. Its dict form
carries `"_type": <class name>` so that `from_dict` can rebuild the exact class, including
values that are not plain JSON (the agent update schedule), which nip failed to rebuild.
New classes join the registry with `@register_parameter_class`; the class names nip writes for
the same values join it as aliases (`register_parameter_alias`, see `reference.py`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar, Self, TypeVar

from nip_core.parameters.typing_utils import accepts_float, classes_in, field_hints
from nip_core.parameters.validation import validate

TYPE_KEY = "_type"
_T = TypeVar("_T", bound=type)
_REGISTRY: dict[str, type[ParameterValue]] = {}
# names another library (nip) writes in `_type` -> the registered class that stands for them
_ALIASES: dict[str, type[ParameterValue]] = {}
# names another library writes for values we do not implement -> why they cannot be loaded
_UNSUPPORTED: dict[str, str] = {}


class ParameterValue:
    """Anything that serialises to a dict with `to_dict` and is rebuilt with `from_dict`."""

    def to_dict(self) -> dict:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, params_dict: dict, ignore_extra_keys: bool = False) -> Self:
        raise NotImplementedError

    @classmethod
    def construct_test_params(cls) -> Self:
        """Small, cheap parameters for tests (by default the defaults)."""
        return cls()


def register_parameter_class(cls: _T) -> _T:
    """Class decorator: make `cls` resolvable from the `_type` key of serialised dicts."""
    if not (isinstance(cls, type) and issubclass(cls, ParameterValue)):
        raise TypeError(f"{cls!r} is not a ParameterValue subclass")
    known = _REGISTRY.get(cls.__name__)
    if known is not None and known is not cls and known.__qualname__ != cls.__qualname__:
        raise ValueError(f"a parameter class named {cls.__name__!r} is already registered")
    _REGISTRY[cls.__name__] = cls
    return cls


def register_parameter_alias(name: str, cls: type[ParameterValue]) -> None:
    """Make `_type: name` (a class name written by nip) resolve to the registered `cls`.

    Registered names take precedence, so an alias equal to a registered name is a no-op when it
    names that same class and an error otherwise.
    """
    if _REGISTRY.get(cls.__name__) is not cls:
        raise ValueError(f"{cls!r} is not a registered parameter class")
    if name in _REGISTRY:
        if _REGISTRY[name] is not cls:
            raise ValueError(f"{name!r} is already a registered parameter class")
        return
    known = _ALIASES.get(name)
    if known is not None and known is not cls:
        raise ValueError(f"{name!r} is already an alias of {known.__name__}")
    _ALIASES[name] = cls


def register_unsupported_parameter_class(name: str, reason: str) -> None:
    """Record a class name nip writes that we cannot load, with the reason for the error."""
    if name in _REGISTRY or name in _ALIASES:
        raise ValueError(f"{name!r} is a loadable parameter class name")
    _UNSUPPORTED[name] = reason


def parameter_class(name: str) -> type[ParameterValue]:
    """The registered class called `name`, or the one its nip alias stands for.

    ValueError if there is none, saying why for nip classes this package does not implement.
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _ALIASES:
        return _ALIASES[name]
    if name in _UNSUPPORTED:
        raise ValueError(
            f"parameter class {name!r} in '{TYPE_KEY}' is not supported: {_UNSUPPORTED[name]}"
        )
    raise ValueError(f"unknown parameter class {name!r} in '{TYPE_KEY}'")


def resolve_class(params_dict: dict, expected: _T) -> _T:
    """The class named by the dict's `_type` (must subclass `expected`), else `expected`."""
    name = params_dict.get(TYPE_KEY)
    if name is None:
        return expected
    if not isinstance(name, str):
        raise ValueError(f"'{TYPE_KEY}' must be a class name string, got {name!r}")
    found = parameter_class(name)
    if not issubclass(found, expected):
        raise ValueError(f"'{TYPE_KEY}' {name!r} is not a kind of {expected.__name__}")
    return found  # type: ignore[return-value]


def serialise(value: Any) -> Any:
    """The JSON-ready form of a field value."""
    if isinstance(value, ParameterValue):
        return value.to_dict()
    return copy.deepcopy(value)


def build_value(value: Any, annotation: Any, ignore_extra_keys: bool = False) -> Any:
    """Turn a dict into the parameter class the annotation names; leave anything else alone."""
    targets = classes_in(annotation, ParameterValue)
    if not targets or not isinstance(value, dict) or isinstance(value, tuple(targets)):
        return value
    target = resolve_class(value, targets[0])
    return target.from_dict(value, ignore_extra_keys=ignore_extra_keys)


@dataclasses.dataclass(frozen=True)
class BaseParameters(ParameterValue):
    """Base of all parameter dataclasses: normalises and validates itself on creation."""

    EXTRA_DICT_KEYS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for name, annotation in field_hints(type(self)).items():
            value = getattr(self, name)
            new = build_value(value, annotation)
            if accepts_float(annotation) and type(new) is int:
                new = float(new)
            if new is not value:
                object.__setattr__(self, name, new)
        validate(self)

    def to_dict(self) -> dict:
        """JSON-ready nested dict, tagged with the class name so it can be rebuilt."""
        out = {f.name: serialise(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out[TYPE_KEY] = type(self).__name__
        return out

    def without_defaults(self) -> dict:
        """`to_dict()` without the fields that hold their default value (recursively): what sets
        this configuration apart. A field added later with a default does not change it, so a
        run's identity (`config_hash`) survives a package upgrade that adds settings."""
        out: dict[str, Any] = {TYPE_KEY: type(self).__name__}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = dataclasses.MISSING
            if default is not dataclasses.MISSING and _same(value, default):
                continue
            out[f.name] = _without_defaults(value)
        return out

    @classmethod
    def from_dict(cls, params_dict: dict, ignore_extra_keys: bool = False) -> Self:
        """Rebuild from `to_dict` output; the input is never modified.

        Raises ValueError on keys that are not fields (unless `ignore_extra_keys`) and on a
        `_type` naming an unknown class or one that is not a kind of `cls`.
        """
        if not isinstance(params_dict, dict):
            raise ValueError(f"{cls.__name__} needs a dict, got {type(params_dict).__name__}")
        target = resolve_class(params_dict, cls)
        if target is not cls:  # let the named class apply its own from_dict rules
            return target.from_dict(params_dict, ignore_extra_keys=ignore_extra_keys)
        hints = field_hints(target)
        skip = {TYPE_KEY, *target.EXTRA_DICT_KEYS}
        unknown = sorted(k for k in params_dict if k not in hints and k not in skip)
        if unknown and not ignore_extra_keys:
            raise ValueError(f"unknown keys for {target.__name__}: {', '.join(map(str, unknown))}")
        kwargs = {
            name: build_value(copy.deepcopy(params_dict[name]), hints[name], ignore_extra_keys)
            for name in hints
            if name in params_dict
        }
        return target._from_checked_dict(params_dict, kwargs)

    @classmethod
    def _from_checked_dict(cls, params_dict: dict, kwargs: dict) -> Self:
        """Hook for subclasses that check the extra keys; by default just construct."""
        try:
            return cls(**kwargs)
        except TypeError as err:  # e.g. a missing required field
            raise ValueError(f"cannot build {cls.__name__}: {err}") from None

    def get(self, address: str) -> Any:
        """The value at a dotted address such as `"agents.verifier.lora_rank"` (KeyError if none)."""
        return get_address(self, address)


def _same(value: Any, default: Any) -> bool:
    """Equal and of the same type (1 and 1.0 and True differ as settings)."""
    return type(value) is type(default) and value == default


def _without_defaults(value: Any) -> Any:
    if isinstance(value, BaseParameters):
        return value.without_defaults()
    if isinstance(value, dict):
        return {k: _without_defaults(v) for k, v in value.items()}
    return serialise(value)


def _step(obj: Any, key: str, walked: str) -> Any:
    """One step of a dotted address: a dataclass field or an agent name."""
    if isinstance(obj, BaseParameters):
        if key not in field_hints(type(obj)):
            where = f" in {walked!r}" if walked else ""
            raise KeyError(f"no parameter {key!r}{where} ({type(obj).__name__})")
        return getattr(obj, key)
    if isinstance(obj, ParameterValue) and isinstance(obj, dict):
        if key not in obj:
            raise KeyError(f"no agent {key!r} in {walked!r} and no '_default' agent")
        return obj[key]
    raise KeyError(f"address continues past the value at {walked!r} (a {type(obj).__name__})")


def get_address(root: Any, address: str) -> Any:
    """Follow a dotted address through parameter classes and the agents mapping."""
    if not isinstance(address, str) or not address:
        raise KeyError(f"empty or invalid address {address!r}")
    obj, walked = root, ""
    for key in address.split("."):
        obj = _step(obj, key, walked)
        walked = f"{walked}.{key}" if walked else key
    return obj
