"""Loading parameters from YAML/JSON files, and dotted `key=value` overrides.

    params = load_hyper_params("configs/malt.yaml", ["agents.verifier.temperature=0.7"])

Override values are parsed as YAML scalars and checked against the field's annotation, so
`rl.num_iterations=abc` fails with a message naming the key and the expected type. Overriding
`agents.<name>.<field>` for an agent that is not listed creates it from `"_default"`.

Numbers. PyYAML follows YAML 1.1, which reads `1e-2`, `1.0e5` and `-.5` as strings and `010`
as octal 8. Files and overrides are read with YAML 1.2's spellings instead, so these are all
floats: `1e-2`, `1E-2`, `5e-5`, `+1e3`, `1.0e-5`, `.5`, `-.5`, `5.`, `1_000.5`; `1_000` is the
int 1000 and `010` the int 10. An int given for a float field becomes a float. For an int
field an override written as a float is accepted only when its decimal value is a whole number
(`1e3` and `1.5e3` are 1000 and 1500, `1.5` is an error); in a file such a value stays a float
and fails validation, naming the field. Infinity and NaN (`.inf`, `inf`, `nan`) are never
accepted: every numeric parameter must be finite. Strings that look like numbers (`"1e3"`) are
quoted when saving, so they load back as strings.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from nip_core.parameters.agents import AgentParameters, AgentsParameters
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
from nip_core.parameters.validation import check_across_sections, setting_several_fields
from nip_core.parameters.versions import AGENT_SERVER_KEYS

_YAML_SUFFIXES = (".yaml", ".yml")

# YAML 1.2 floats that YAML 1.1 (PyYAML) leaves as strings: an exponent without a dot or
# without a sign, and a signed leading dot. Needs a dot or an exponent, so ints stay ints.
_FLOAT_1_2 = re.compile(
    r"""^[-+]?(?:
        [0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?   # 5.  1.5  1.0e-5  1.5e3
      | \.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?          # .5  -.5  .5e-3
      | [0-9][0-9_]*[eE][-+]?[0-9]+                 # 1e-2  5E3  1e+3
    )$""",
    re.VERBOSE,
)
# Decimal ints with leading zeros: YAML 1.1 reads `010` as octal 8 and `08` as a string.
_ZERO_PADDED_INT = re.compile(r"^[-+]?0[0-9_]+$")
_NON_FINITE = re.compile(r"^[-+]?\.?(?:inf|infinity|nan)$", re.IGNORECASE)


class _ParamsLoader(yaml.SafeLoader):
    """`yaml.safe_load`, but with YAML 1.2's numbers: `1e-2` is a float, `010` is ten."""


class _ParamsDumper(yaml.SafeDumper):
    """`yaml.safe_dump` that quotes strings `_ParamsLoader` reads as numbers (`"1e3"`, `"08"`)."""


def _construct_int(loader: _ParamsLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if _ZERO_PADDED_INT.match(text):
        return int(text.replace("_", ""), 10)
    return loader.construct_yaml_int(node)


for _cls in (_ParamsLoader, _ParamsDumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+.0123456789"))
    _cls.add_implicit_resolver("tag:yaml.org,2002:int", _ZERO_PADDED_INT, list("-+0"))
_ParamsLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_ParamsLoader)  # noqa: S506 - a SafeLoader subclass


def read_params_file(path: str | Path) -> dict:
    """The mapping stored in a YAML or JSON file (ValueError for other suffixes or content)."""
    path = Path(path)
    suffix = path.suffix.lower()
    text = path.read_text(encoding="utf-8")
    if suffix in _YAML_SUFFIXES:
        data = _load_yaml(text)
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
        text = yaml.dump(data, Dumper=_ParamsDumper, sort_keys=True)
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
    with setting_several_fields():
        for item in overrides:
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ValueError(f"override {item!r}: expected 'dotted.key=value'")
            params = _override(params, key.split("."), raw.strip(), key)
    check_across_sections(params)
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
    if head not in hints and isinstance(obj, AgentParameters) and head in AGENT_SERVER_KEYS:
        moved = f"server.{AGENT_SERVER_KEYS[head]}"
        raise KeyError(f"override {key!r}: a setting of the run's server now; set {moved}")
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


def _takes_int_not_float(annotation: Any) -> bool:
    return int in union_members(annotation) and not accepts_float(annotation)


def _whole_number(raw: str) -> int | None:
    """The int a float spelling such as `1e3` or `1.5e3` denotes exactly, else None."""
    try:
        number = decimal.Decimal(raw.replace("_", ""))
    except decimal.InvalidOperation:
        return None
    if not number.is_finite() or number != number.to_integral_value():
        return None
    return int(number)


def parse_override_value(raw: str, annotation: Any, key: str) -> Any:
    """Parse `raw` as a YAML scalar and check it fits `annotation` (ValueError if not).

    Numbers follow the module docstring: any usual float spelling for float fields, whole
    numbers only for int fields, never infinity or NaN.
    """
    try:
        value = _load_yaml(raw) if raw else ""
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
    numeric = accepts_float(annotation) or int in union_members(annotation)
    if isinstance(value, float):
        non_finite = not math.isfinite(value)
    else:  # `inf` and `nan` without the dot are strings in YAML
        non_finite = isinstance(value, str) and bool(_NON_FINITE.match(value))
    if numeric and non_finite and not _accepts_str(annotation):
        raise ValueError(
            f"override {key!r}: expected a finite number ({describe(annotation)}), got {raw!r}"
        )
    if accepts_float(annotation) and type(value) is int:
        value = float(value)
    elif type(value) is float and _takes_int_not_float(annotation):
        whole = _whole_number(raw)
        value = whole if whole is not None else value
    if not matches(value, annotation):
        raise ValueError(f"override {key!r}: expected {describe(annotation)}, got {raw!r}")
    return value
