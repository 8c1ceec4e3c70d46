"""Upgrading hyper-parameter dicts written by older versions (or by nip) to the current format.

Conversions are registered by the version they convert *from* (None: dicts that carry no
version, which includes nip's and hand-written configs) and say which version they produce.
`convert_hyper_param_dict` applies them in sequence until it reaches the current version; a
version between two registered ones has the format of the next registered one, since the
format only changes where a conversion is registered.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import nip_core
from nip_core.parameters.server import ServerParameters

PACKAGE_NAME = "nip-malt"
PACKAGE_NAME_KEY = "_package_name"
PACKAGE_VERSION_KEY = "_package_version"

Converter = Callable[[dict], dict]


@dataclass(frozen=True)
class Conversion:
    """One registered upgrade step."""

    from_version: str | None
    to_version: str
    convert: Converter


_CONVERSIONS: dict[str | None, Conversion] = {}


def parse_version(version: str) -> tuple[int, ...]:
    """ "1.2.3" -> (1, 2, 3); ValueError on anything else."""
    try:
        return tuple(int(part) for part in version.split("."))
    except (AttributeError, ValueError):
        raise ValueError(f"invalid version {version!r}: expected dotted integers") from None


def _older(a: str | None, b: str) -> bool:
    return a is None or parse_version(a) < parse_version(b)


def register_conversion(
    from_version: str | None, to_version: str
) -> Callable[[Converter], Converter]:
    """Decorator: register `fn(old_dict) -> new_dict` upgrading `from_version` dicts."""
    if from_version is not None and not _older(from_version, to_version):
        raise ValueError(f"conversion must go forwards: {from_version!r} -> {to_version!r}")

    def register(fn: Converter) -> Converter:
        if from_version in _CONVERSIONS:
            raise ValueError(f"a conversion from version {from_version!r} is already registered")
        _CONVERSIONS[from_version] = Conversion(from_version, to_version, fn)
        return fn

    return register


def _next_step(version: str | None) -> Conversion | None:
    """The conversion that applies to `version`, or None if it already has the latest format."""
    if version in _CONVERSIONS:
        return _CONVERSIONS[version]
    later = [v for v in _CONVERSIONS if v is not None and _older(version, v)]
    return _CONVERSIONS[min(later, key=parse_version)] if later else None


def stored_version(params_dict: dict) -> str | None:
    """The version a dict was written by; None if unversioned or written by another package."""
    if params_dict.get(PACKAGE_NAME_KEY, PACKAGE_NAME) != PACKAGE_NAME:
        return None
    version = params_dict.get(PACKAGE_VERSION_KEY)
    if version is not None and not isinstance(version, str):
        raise ValueError(f"{PACKAGE_VERSION_KEY} must be a string, got {version!r}")
    return version


def convert_hyper_param_dict(params_dict: dict, target: str | None = None) -> dict:
    """A copy of `params_dict` upgraded to `target` (default: the installed version).

    Raises ValueError for a dict written by a newer version than the target.
    """
    target = target or nip_core.__version__
    out = copy.deepcopy(params_dict)
    version = stored_version(out)
    if version is not None and parse_version(version) > parse_version(target):
        raise ValueError(f"parameters written by {PACKAGE_NAME} {version}, newer than {target}")
    while _older(version, target):
        step = _next_step(version)
        if step is None or not _older(step.from_version, target):
            break
        out = step.convert(out)
        version = step.to_version
    out[PACKAGE_NAME_KEY] = PACKAGE_NAME
    out[PACKAGE_VERSION_KEY] = target
    return out


# -- Registered conversions -------------------------------------------------------------------

_PROTOCOL_RENAMES = {"pvg": "nip", "abstract_decision_problem": "adp"}
_TYPE_RENAMES = {"PvgProtocolParameters": "NipProtocolParameters"}
# nip fields for tensor scenarios and trainers we do not implement; they cannot matter here
_NIP_ONLY_TOP_LEVEL = (
    "functionalize_modules",
    "pretrain_agents",
    "d_representation",
    "message_size",
    "include_linear_message_space",
    "d_linear_message_space",
    "ppo",
    "vanilla_ppo",
    "spg",
    "reinforce",
    "solo_agent",
    "image_classification",
    "zk_protocol",
    "message_regression",
    "base_run",
)
_NIP_ONLY_SECTION_KEYS = {
    "text_rl": ("save_transcripts", "transcript_format"),
    "code_validation": ("system_prompt_version",),
    "protocol_common": ("zero_knowledge",),
    # nip's image-classification dataset options (class selection and balancing)
    "dataset_options": (
        "binarification_method",
        "selected_classes",
        "binarification_seed",
        "make_balanced",
    ),
}
_RL_KEYS = ("num_iterations", "rollouts_per_iteration", "num_test_iterations", "num_epochs")

_TENSOR_AGENT = "a setting of nip's tensor agents; a text agent's model is its model_name"
_LR_FACTORS = "learning-rate factors of a tensor agent's parts; a text fine-tune has one rate"
# nip's per-agent settings that no text agent reads: (nip's value, why another is refused)
_AGENT_LEFTOVERS: dict[str, tuple[object, str]] = {
    "agent_lr_factor": (None, _LR_FACTORS),
    "body_lr_factor": (None, _LR_FACTORS),
    "update_schedule": (
        {"_type": "ConstantUpdateSchedule"},
        "the text trainers update every agent on every iteration (freeze_agent stops one)",
    ),
    "use_manual_architecture": (False, _TENSOR_AGENT),
    "normalize_message_history": (False, _TENSOR_AGENT),
    "use_orthogonal_initialisation": (True, _TENSOR_AGENT),
    "orthogonal_initialisation_gain": (1.0, _TENSOR_AGENT),
    "load_checkpoint_and_parameters": (
        False,
        "nip checkpoints are not loaded; name the model to start from in model_name",
    ),
}
# where a checkpoint is loaded from: read only when load_checkpoint_and_parameters is true
_CHECKPOINT_KEYS = (
    "checkpoint_entity",
    "checkpoint_project",
    "checkpoint_run_id",
    "checkpoint_version",
)


def _rename_protocols(d: dict) -> None:
    proto = d.get("interaction_protocol")
    if isinstance(proto, str):
        d["interaction_protocol"] = _PROTOCOL_RENAMES.get(proto, proto)
    if "pvg_protocol" in d:
        if "nip_protocol" in d:
            raise ValueError("both 'pvg_protocol' and 'nip_protocol' are present")
        d["nip_protocol"] = d.pop("pvg_protocol")
    section = d.get("nip_protocol")
    if isinstance(section, dict) and section.get("_type") in _TYPE_RENAMES:
        section["_type"] = _TYPE_RENAMES[section["_type"]]


def _drop_nip_only_keys(d: dict) -> list[str]:
    dropped = [k for k in _NIP_ONLY_TOP_LEVEL if k in d]
    for section, keys in _NIP_ONLY_SECTION_KEYS.items():
        sub = d.get(section)
        if isinstance(sub, dict):
            dropped += [f"{section}.{k}" for k in keys if k in sub]
    for key in dropped:
        head, _, tail = key.partition(".")
        container, name = (d[head], tail) if tail else (d, head)
        del container[name]
    rl = d.get("rl")
    if isinstance(rl, dict) and "frames_per_batch" in rl:
        # nip's tensor-RL section: keep the counts we share; None means "use frames" there
        kept = {k: rl[k] for k in _RL_KEYS if rl.get(k) is not None}
        dropped += [f"rl.{k}" for k in rl if k not in kept and k != "_type"]
        d["rl"] = {**kept, "_type": "RlTrainerParameters"}
    return dropped


def _holds_nip_value(key: str, value: object) -> bool:
    if key.endswith("_lr_factor") and isinstance(value, dict):  # LrFactors(actor=1, critic=1)
        factors = {k: v for k, v in value.items() if k != "_type"}
        return set(factors) <= {"actor", "critic"} and all(v == 1.0 for v in factors.values())
    return value == _AGENT_LEFTOVERS[key][0]


# settings of the run's server that nip and our older configs kept on every agent -> `server.*`
AGENT_SERVER_KEYS = {
    "language_model_server_engine": "engine",
    "language_model_server_shared": "shared",
    "language_model_server_max_restarts": "max_restarts",
    "vllm_server_port": "vllm_port",
    "vllm_tensor_parallel_size": "vllm_tensor_parallel_size",
    "vllm_data_parallel_size": "vllm_data_parallel_size",
    "vllm_gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "vllm_max_model_len": "vllm_max_model_len",
    "vllm_enforce_eager": "vllm_enforce_eager",
    "training_num_processes": "training_num_processes",
    "training_deepspeed_config": "training_deepspeed_config",
}


def _server_default(key: str) -> object:
    return getattr(ServerParameters, key)


def server_settings_from_agents(d: dict) -> dict:
    """`d` with the server settings its agents hold moved into its `server` section: one server
    serves the run, so they are set once. A value at its default counts as unset; two agents,
    or an agent and `server`, asking for different values is a ValueError naming both."""
    agents = d.get("agents")
    if not isinstance(agents, dict):
        return d
    server = dict(d.get("server") or {})
    found: dict[str, tuple[str, object]] = {}  # server key -> (where it was set, value)
    for key, value in server.items():
        found[key] = (f"server.{key}", value)
    moved_agents = {}
    for name, agent in agents.items():
        if isinstance(agent, dict):
            agent = dict(agent)
            for old in [k for k in agent if k in AGENT_SERVER_KEYS]:
                key, value = AGENT_SERVER_KEYS[old], agent.pop(old)
                if value == _server_default(key):
                    continue
                where, earlier = found.setdefault(key, (f"agents.{name}.{old}", value))
                if earlier != value:
                    raise ValueError(
                        f"agents.{name}.{old}={value!r} and {where}={earlier!r}: one server "
                        f"serves the run; set it once, as server.{key}"
                    )
                server[key] = value
        moved_agents[name] = agent
    out = {**d, "agents": moved_agents}
    if server:
        out["server"] = server
    return out


def without_server_settings(agent: dict) -> dict:
    """`agent` without server settings at their defaults (an agent dict nip wrote, or one of
    ours from before they moved); ValueError for one that asks for more: it belongs in the
    run's `server` section."""
    for old in [k for k in agent if k in AGENT_SERVER_KEYS]:
        key = AGENT_SERVER_KEYS[old]
        if agent[old] != _server_default(key):
            raise ValueError(
                f"agent setting {old}={agent[old]!r} is a setting of the run's server: "
                f"set server.{key}"
            )
    return {k: v for k, v in agent.items() if k not in AGENT_SERVER_KEYS}


def without_nip_agent_settings(agent: dict) -> dict:
    """`agent` without nip's tensor-era and checkpoint settings, which no text agent reads:
    each must hold nip's value (a dict nip wrote, or one of ours from before they went);
    ValueError naming the first that asks for something the text agents do not do."""
    for key in [k for k in agent if k in _AGENT_LEFTOVERS]:
        if not _holds_nip_value(key, agent[key]):
            reason = _AGENT_LEFTOVERS[key][1]
            raise ValueError(f"agent setting {key}={agent[key]!r} is not supported: {reason}")
    dropped = set(_AGENT_LEFTOVERS) | set(_CHECKPOINT_KEYS)
    return {k: v for k, v in agent.items() if k not in dropped}


@register_conversion(None, "0.1.0")
def _from_unversioned(d: dict) -> dict:
    """nip (and pre-0.1.0) names -> ours.

    Renames protocol "pvg" -> "nip" and "abstract_decision_problem" -> "adp", the section
    `pvg_protocol` -> `nip_protocol`, and drops nip's tensor-only settings (with a warning).
    Unlike nip's own 0.1 -> 1.0 step we do NOT shift `min_message_rounds`: an unversioned dict
    may be a hand-written config in today's format, where that shift would be wrong.
    """
    out = copy.deepcopy(d)
    _rename_protocols(out)
    dropped = _drop_nip_only_keys(out)
    if dropped:
        warnings.warn(f"ignoring nip-only parameters: {', '.join(dropped)}", stacklevel=3)
    return out
