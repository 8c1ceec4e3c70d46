"""Loading parameters from YAML/JSON files, and dotted `key=value` overrides.

    params = load_hyper_params("configs/malt.yaml", ["agents.verifier.temperature=0.7"])

Override values are parsed as YAML scalars and checked against the field's annotation, so
`rl.num_iterations=abc` fails with a message naming the key and the expected type. Overriding
`agents.<name>.<field>` for an agent that is not listed creates it from `"_default"`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from nip_core.parameters.agents import AgentsParameters
from nip_core.parameters.base import BaseParameters, ParameterValue
from nip_core.parameters.hyper import HyperParameters
from nip_core.parameters.typing_utils import (
    accepts_float,
    classes_in,
    describe,
    field_hints,
    is_optional,
    literal_values,
    matches,
    union_members,
)

_YAML_SUFFIXES = (".yaml", ".yml")


def read_params_file(path: str | Path) -> dict:
    """The mapping stored in a YAML or JSON file (ValueError for other suffixes or content)."""
    path = Path(path)
    suffix = path.suffix.lower()
    text = path.read_text(encoding="utf-8")
    if suffix in _YAML_SUFFIXES:
        data = yaml.safe_load(text)
    elif suffix == ".json":
        data = json.loads(text)
    else:
        raise ValueError(f"{path}: parameters must be a .yaml, .yml or .json file")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_hyper_params(path: str | Path, overrides: Sequence[str] = ()) -> HyperParameters:
    """Read `HyperParameters` from a YAML or JSON file, then apply dotted overrides."""
    return apply_overrides(HyperParameters.from_dict(read_params_file(path)), overrides)


def save_hyper_params(params: HyperParameters, path: str | Path) -> Path:
    """Write `params` (with package name and version) as YAML or JSON, chosen by suffix."""
    path = Path(path)
    data = params.to_dict(include_package_meta=True)
    if path.suffix.lower() in _YAML_SUFFIXES:
        text = yaml.safe_dump(data, sort_keys=True)
    elif path.suffix.lower() == ".json":
        text = json.dumps(data, indent=2, sort_keys=True)
    else:
        raise ValueError(f"{path}: parameters must be saved as .yaml, .yml or .json")
    path.write_text(text, encoding="utf-8")
    return path


def apply_overrides(params: HyperParameters, overrides: Sequence[str]) -> HyperParameters:
    """A new `HyperParameters` with each `"dotted.key=value"` applied in order."""
    if isinstance(overrides, str):
        raise ValueError("overrides must be a sequence of 'key=value' strings, not one string")
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"override {item!r}: expected 'dotted.key=value'")
        params = _override(params, key.split("."), raw.strip(), key)
    return params


def _override(obj: Any, parts: list[str], raw: str, key: str) -> Any:
    """`obj` with the value at `parts` replaced (objects are rebuilt, never mutated)."""
    head, rest = parts[0], parts[1:]
    if isinstance(obj, AgentsParameters):
        if not rest:
            raise ValueError(f"override {key!r}: set an agent's fields, not the whole agent")
        if head not in obj:
            raise KeyError(f"override {key!r}: no agent {head!r} and no '_default' agent")
        return obj.with_agent(head, _override(obj[head], rest, raw, key))
    if not isinstance(obj, BaseParameters):
        raise KeyError(f"override {key!r}: the address continues past a plain value")
    hints = field_hints(type(obj))
    if head not in hints:
        raise KeyError(f"override {key!r}: {type(obj).__name__} has no parameter {head!r}")
    current = getattr(obj, head)
    if rest:
        if not isinstance(current, (BaseParameters, AgentsParameters)):
            raise KeyError(f"override {key!r}: the address continues past the value of {head!r}")
        new = _override(current, rest, raw, key)
    elif isinstance(current, ParameterValue) or classes_in(hints[head], ParameterValue):
        raise ValueError(f"override {key!r}: whole sub-parameter values cannot be overridden")
    else:
        new = parse_override_value(raw, hints[head], key)
    return dataclasses.replace(obj, **{head: new})


def _accepts_str(annotation: Any) -> bool:
    literals = literal_values(annotation) or ()
    return str in union_members(annotation) or any(isinstance(v, str) for v in literals)


def parse_override_value(raw: str, annotation: Any, key: str) -> Any:
    """Parse `raw` as a YAML scalar and check it fits `annotation` (ValueError if not)."""
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    if value is None:
        if not is_optional(annotation):
            raise ValueError(
                f"override {key!r}: None is not allowed (expects {describe(annotation)})"
            )
        return None
    if not isinstance(value, str) and _accepts_str(annotation) and not matches(value, annotation):
        value = raw  # e.g. a model name that YAML would read as a number
    if accepts_float(annotation) and type(value) is int:
        value = float(value)
    if not matches(value, annotation):
        raise ValueError(f"override {key!r}: expected {describe(annotation)}, got {raw!r}")
    return value
