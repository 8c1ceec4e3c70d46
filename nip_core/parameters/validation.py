"""All validation of parameter objects, in one place.

`validate(params)` runs on every parameter object as it is created: first generic checks read
from the annotations (types, Literal values, non-negative counts), then the cross-field rules
registered below for the object's class (or any base class). Errors are ValueErrors that name
the class, the field and the problem.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

from nip_core.model_api.temperatures import CANDIDATES_MAX_TEMPERATURE, DECODED_MAX_TEMPERATURE
from nip_core.parameters.protocol_kinds import CLOSED_REPLY_PROTOCOLS
from nip_core.parameters.typing_utils import describe, field_hints, literal_values, matches

# int fields whose names match this are counts or sizes and must not be negative
_COUNT_NAME = re.compile(r"^(num_.*|.*_size|.*_rank|max_.*|per_device_.*|.*_steps)$")
# counts where zero would deadlock or make the run empty
_POSITIVE = {
    "max_concurrent_requests",
    "rollout_shard_size",
    "num_responses_per_timestep",
    "max_message_rounds",
    "per_device_train_batch_size",
    "switch_guard_episodes",
    "vllm_tensor_parallel_size",
    "vllm_data_parallel_size",
    "training_num_processes",
    "gradient_accumulation_steps",
}
_UNSUPPORTED = {
    ("scenario", "graph_isomorphism"): "nip's tensor scenarios are not supported",
    ("scenario", "image_classification"): "nip's tensor scenarios are not supported",
}

Rule = Callable[[Any], None]
_RULES: dict[str, list[Rule]] = {}


def rule(*class_names: str) -> Callable[[Rule], Rule]:
    """Register a cross-field check for the named classes (and their subclasses)."""

    def register(fn: Rule) -> Rule:
        for name in class_names:
            _RULES.setdefault(name, []).append(fn)
        return fn

    return register


def validate(params: Any) -> None:
    """Check one parameter object; ValueError naming the field on the first problem."""
    cls = type(params)
    if dataclasses.is_dataclass(cls):
        for name, annotation in field_hints(cls).items():
            _check_field(cls.__name__, name, getattr(params, name), annotation)
    for klass in cls.__mro__:
        for check in _RULES.get(klass.__name__, ()):
            check(params)


def _check_field(owner: str, name: str, value: Any, annotation: Any) -> None:
    if not matches(value, annotation):
        allowed = literal_values(annotation)
        if allowed is not None and isinstance(value, str):
            hint = _UNSUPPORTED.get((name, value))
            extra = f" ({hint})" if hint else ""
            raise ValueError(f"{owner}.{name}: {value!r} is not one of {allowed}{extra}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{owner}.{name}: must be a finite number, got {value!r}")
        raise ValueError(
            f"{owner}.{name}: expected {describe(annotation)}, got {type(value).__name__} {value!r}"
        )
    if isinstance(value, int) and not isinstance(value, bool) and _COUNT_NAME.match(name):
        low = 1 if name in _POSITIVE else 0
        if value < low:
            raise ValueError(f"{owner}.{name}: must be >= {low}, got {value}")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _in_range(owner: str, name: str, value: float, low: float, high: float, *, open_low=False):
    ok = (low < value if open_low else low <= value) and value <= high
    bracket = "(" if open_low else "["
    _require(ok, f"{owner}.{name}: must be in {bracket}{low}, {high}], got {value}")


@rule("PureTextAgentParameters")
def _agent_rules(p: Any) -> None:
    name = type(p).__name__
    _require(
        (p.lora_alpha is None) != (p.lora_alpha_scale is None),
        f"{name}: set exactly one of lora_alpha and lora_alpha_scale "
        f"(got lora_alpha={p.lora_alpha!r}, lora_alpha_scale={p.lora_alpha_scale!r})",
    )
    _require(
        p.temperature is None or p.top_p is None,
        f"{name}: set at most one of temperature and top_p",
    )
    if p.temperature is not None:
        _require(p.temperature >= 0, f"{name}.temperature: must be >= 0, got {p.temperature}")
    if p.top_p is not None:
        _in_range(name, "top_p", p.top_p, 0.0, 1.0, open_low=True)
    if p.lora_alpha is not None:
        _require(p.lora_alpha > 0, f"{name}.lora_alpha: must be > 0, got {p.lora_alpha}")
    if p.lora_alpha_scale is not None:
        _require(p.lora_alpha_scale > 0, f"{name}.lora_alpha_scale: must be > 0")
    _require(0 <= p.lora_dropout < 1, f"{name}.lora_dropout: must be in [0, 1)")
    if p.lora_top_layers is not None:
        _require(p.lora_top_layers >= 1, f"{name}.lora_top_layers: must be >= 1")
    stop_at = p.training_stop_at_pair_accuracy
    if stop_at is not None:
        _in_range(name, "training_stop_at_pair_accuracy", stop_at, 0.0, 1.0, open_low=True)
    _require(
        p.training_prompt_gradients or not p.training_activation_checkpointing,
        f"{name}: training_prompt_gradients false cannot run with "
        "training_activation_checkpointing true, which runs every prompt whole",
    )
    if p.max_tokens_per_message is not None:
        _require(p.max_tokens_per_message >= 1, f"{name}.max_tokens_per_message: must be >= 1")
    timeout = p.request_timeout_seconds
    if timeout is not None:
        _require(timeout > 0, f"{name}.request_timeout_seconds: must be > 0, got {timeout}")
    for url in p.model_server_replicas or ():
        _require(
            isinstance(url, str) and url.startswith(("http://", "https://")),
            f"{name}.model_server_replicas: {url!r} is not an http(s) base URL",
        )


@rule("PureTextMaltParameters")
def _malt_rules(p: Any) -> None:
    _in_range(
        type(p).__name__,
        "interval_threshold_proportion",
        p.interval_threshold_proportion,
        0.0,
        1.0,
        open_low=True,
    )
    if p.rollout_temperature is not None:  # above 2 only for closed replies (check_across_...)
        _in_range(
            type(p).__name__,
            "rollout_temperature",
            p.rollout_temperature,
            0.0,
            CANDIDATES_MAX_TEMPERATURE,
        )
    _require(
        p.rollout_early_verdict_retries >= 0,
        f"{type(p).__name__}.rollout_early_verdict_retries: must be >= 0",
    )


@rule("PureTextEiParameters")
def _ei_rules(p: Any) -> None:
    name = type(p).__name__
    _require(p.weighting_sample_size_factor > 0, f"{name}.weighting_sample_size_factor: > 0")
    _require(p.weighting_epsilon >= 0, f"{name}.weighting_epsilon: must be >= 0")


@rule("TextRlParameters")
def _text_rl_rules(p: Any) -> None:
    name = type(p).__name__
    prop = p.verifier_guess_replacement_proportion
    _in_range(name, "verifier_guess_replacement_proportion", prop, 0.0, 1.0)
    rate = p.verifier_guess_replacement_annealing_rate
    _in_range(name, "verifier_guess_replacement_annealing_rate", rate, 0.0, 1.0)
    _require(
        0.0 <= p.validation_fraction < 1.0,
        f"{name}.validation_fraction: must be in [0, 1), got {p.validation_fraction}",
    )
    _require(
        not p.switch_guard or p.validation_fraction > 0,
        f"{name}.switch_guard needs validation episodes: set text_rl.validation_fraction > 0 "
        "(e.g. 0.2) or text_rl.switch_guard=false",
    )
    _require(p.switch_guard_margin >= 0, f"{name}.switch_guard_margin: must be >= 0")
    share = p.switch_guard_max_verdict_share
    _require(
        share is None or 0.5 < share <= 1.0,
        f"{name}.switch_guard_max_verdict_share: must be in (0.5, 1] or null, got {share}",
    )
    drift = p.switch_guard_max_drift
    _require(drift is None or drift > 0, f"{name}.switch_guard_max_drift: must be > 0 or null")


@rule("RlTrainerParameters")
def _rl_rules(p: Any) -> None:
    name = type(p).__name__
    _require(p.learning_rate > 0, f"{name}.learning_rate: must be > 0")
    _require(
        p.rollouts_per_iteration >= 1,
        f"{name}.rollouts_per_iteration: must be >= 1, got {p.rollouts_per_iteration}",
    )
    _require(p.num_iterations >= 1, f"{name}.num_iterations: must be >= 1, got {p.num_iterations}")


@rule("NipProtocolParameters", "DebateProtocolParameters", "MnipProtocolParameters")
def _round_rules(p: Any) -> None:
    name = type(p).__name__
    _require(p.min_message_rounds >= 0, f"{name}.min_message_rounds: must be >= 0")
    _require(
        p.min_message_rounds <= p.max_message_rounds,
        f"{name}: min_message_rounds ({p.min_message_rounds}) > "
        f"max_message_rounds ({p.max_message_rounds})",
    )


@rule("HyperParameters")
def _hyper_rules(p: Any) -> None:
    _in_range("HyperParameters", "test_size", p.test_size, 0.0, 1.0)
    warm = p.pure_text_malt.num_initial_ei_iterations
    _require(
        warm <= p.rl.num_iterations,
        f"HyperParameters: pure_text_malt.num_initial_ei_iterations ({warm}) > "
        f"rl.num_iterations ({p.rl.num_iterations})",
    )
    for field in dataclasses.fields(p):
        value = getattr(p, field.name)
        _require(value is not None, f"HyperParameters.{field.name}: must not be None")
    if not _SETTING_SEVERAL.get():
        check_across_sections(p)


# True while `apply_overrides` sets several fields one by one: a rule that spans sections (the
# signal and its share) is checked once they are all set, not between two of them.
_SETTING_SEVERAL: contextvars.ContextVar[bool] = contextvars.ContextVar("setting", default=False)


@contextlib.contextmanager
def setting_several_fields():
    token = _SETTING_SEVERAL.set(True)
    try:
        yield
    finally:
        _SETTING_SEVERAL.reset(token)


def check_across_sections(p: Any) -> None:
    """The rules that span sections, checked once all of them are set (`_SETTING_SEVERAL`)."""
    check_training_signal(p)
    check_training_objective(p)
    check_train_extra_difficulty(p)
    check_rollout_temperature(p)
    _require(
        p.pure_text_malt.rollout_early_verdict_retries == 0
        or p.protocol_common.early_decision_ends_episode,
        "HyperParameters: pure_text_malt.rollout_early_verdict_retries re-samples verdicts given "
        "too early, which only protocol_common.early_decision_ends_episode=true lets a verifier "
        "give",
    )


def check_rollout_temperature(p: Any) -> None:
    """A decoded reply is sampled in the OpenAI API's range (0-2); only a reply drawn from a
    closed set (a softmax over its candidates' scores) may be drawn hotter."""
    temperature = p.pure_text_malt.rollout_temperature
    _require(
        temperature is None or temperature <= DECODED_MAX_TEMPERATURE or p.draws_closed_replies,
        f"HyperParameters: pure_text_malt.rollout_temperature={temperature} is above "
        f"{DECODED_MAX_TEMPERATURE}, the range of a decoded reply; only a protocol whose reply is "
        f"drawn from candidates ({', '.join(CLOSED_REPLY_PROTOCOLS)}) may go to "
        f"{CANDIDATES_MAX_TEMPERATURE}, and {p.interaction_protocol!r} decodes",
    )


def check_train_extra_difficulty(p: Any) -> None:
    """A second grade's bugs join the train split only as pairs with their problem's correct
    solution: a solo protocol would see more buggy rows than correct ones."""
    extra, name = p.dataset_options.train_extra_difficulty, "dataset_options.train_extra_difficulty"
    if extra is None:
        return
    _require(
        p.dataset == "humaneval-buggy",
        f"HyperParameters: {name} needs dataset 'humaneval-buggy', got {p.dataset!r}",
    )
    _require(
        p.shows_pairs,
        f"HyperParameters: {name} pools bugs as pairs with their correct solution, which only a "
        f"pairwise protocol shows; {p.interaction_protocol!r} judges one solution at a time",
    )
    _require(
        extra != p.dataset_options.difficulty,
        f"HyperParameters: {name} is {extra!r}, the grade dataset_options.difficulty already gives",
    )


def check_training_signal(p: Any) -> None:
    """The verifier's label share means something only where label rows are written: MALT's
    label pairs, or the SFT rows of expert-iteration iterations. A share nothing reads, or
    label pairs with no share, is a configuration that does not say what it trains on."""
    malt, share = p.pure_text_malt, p.text_rl.verifier_guess_replacement_proportion
    if p.trainer != "pure_text_malt":
        return
    _require(
        malt.balance_verifier_by_label or not malt.balance_spares_settled_labels,
        "HyperParameters: pure_text_malt.balance_spares_settled_labels changes the label balance, "
        "which pure_text_malt.balance_verifier_by_label=false turns off",
    )
    _require(
        not malt.trains_on_label_pairs or share > 0,
        f"HyperParameters: pure_text_malt.verifier_training_signal="
        f"{malt.verifier_training_signal} needs text_rl.verifier_guess_replacement_proportion "
        "> 0 (the share of the verifier's chats that get a label pair)",
    )
    _require(
        malt.trains_on_label_pairs or share == 0 or malt.num_initial_ei_iterations > 0,
        "HyperParameters: text_rl.verifier_guess_replacement_proportion="
        f"{share} writes label answers, but pure_text_malt.verifier_training_signal="
        "sampled_pairs trains MALT on sampled pairs only and there is no expert-iteration "
        "iteration to use it: set the signal to label_pairs or sampled_and_label_pairs, or the "
        "proportion to 0",
    )


@rule("ServerParameters")
def _server_rules(p: Any) -> None:
    _in_range(
        "ServerParameters",
        "vllm_gpu_memory_utilization",
        p.vllm_gpu_memory_utilization,
        0,
        1,
        open_low=True,
    )
    _require(
        p.vllm_max_model_len is None or p.vllm_max_model_len >= 1,
        "ServerParameters.vllm_max_model_len: must be >= 1",
    )
    _require(p.training_num_processes >= 1, "ServerParameters.training_num_processes: must be >= 1")


def check_training_objective(p: Any) -> None:
    """KTO needs the rows it trains on (the verifier's sampled replies, not label pairs), a
    provider that trains it (our self-hosted server: the OpenAI API has no KTO) and batches of
    two or more (its KL term pairs each answer with another prompt of the batch)."""
    malt = p.pure_text_malt
    if p.trainer != "pure_text_malt" or malt.training_objective != "kto":
        return
    _require(
        malt.verifier_training_signal == "sampled_pairs",
        "HyperParameters: pure_text_malt.training_objective=kto trains on the agents' sampled "
        f"replies; verifier_training_signal={malt.verifier_training_signal} writes label pairs",
    )
    _require(
        malt.kto_rows_per_parent >= 2,
        "PureTextMaltParameters.kto_rows_per_parent: must be >= 2 (a desirable and an "
        "undesirable answer)",
    )
    for name, agent in p.agents.items():
        if agent.freeze_agent or agent.use_dummy_api:
            continue
        _require(
            agent.model_provider == "SelfHosted",
            f"HyperParameters: pure_text_malt.training_objective=kto is trained by our "
            f"self-hosted server; agent {name!r} uses {agent.model_provider}, whose fine-tuning "
            "API has no KTO",
        )
        _require(
            agent.per_device_train_batch_size >= 2,
            f"HyperParameters: pure_text_malt.training_objective=kto needs "
            f"agents.{name}.per_device_train_batch_size >= 2 (KTO's KL term pairs each answer "
            "with another prompt of its batch)",
        )


@rule("AgentsParameters")
def _agents_rules(agents: Any) -> None:
    names = [n for n in agents if n != "_default"]
    for name in agents:
        _require(isinstance(name, str) and name != "", f"agent names must be strings: {name!r}")
    served = {
        (params.language_model_server_scheme_host, params.language_model_server_port): name
        for name, params in agents.items()
        if getattr(params, "model_provider", None) == "SelfHosted" and not params.use_dummy_api
    }
    _require(
        len(served) <= 1,
        "the self-hosted agents name different servers "
        f"({', '.join(f'{n}: {h}:{p}' for (h, p), n in served.items())}); one server serves "
        "the run",
    )
    for a in names:
        for b in names:
            _require(a == b or a not in b, f"agent name {a!r} is a substring of {b!r}")
