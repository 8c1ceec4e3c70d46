"""Per-agent parameters and the agents mapping with its `"_default"` fallback.

`PureTextAgentParameters` holds the fields of nip's pure-text agent that a text agent uses, and
ours. nip's tensor-era and checkpoint fields (learning-rate factors, update schedule, manual
architecture, orthogonal initialisation, checkpoint loading) are not fields: an agent dict that
holds nip's value for them loads without them, any other value is refused
(`nip_core.parameters.versions.without_nip_agent_settings`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

from nip_core.model_api.dpo_losses import DpoLossType
from nip_core.parameters.base import (
    TYPE_KEY,
    BaseParameters,
    ParameterValue,
    register_parameter_class,
    resolve_class,
)
from nip_core.parameters.validation import validate
from nip_core.parameters.versions import without_nip_agent_settings, without_server_settings

DEFAULT_AGENT = "_default"


@dataclass(frozen=True)
class AgentParameters(BaseParameters):
    """Base of per-agent parameters; their dicts also say whether the agent acts randomly."""

    is_random: ClassVar[bool] = False
    EXTRA_DICT_KEYS: ClassVar[tuple[str, ...]] = ("is_random",)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["is_random"] = self.is_random
        return out

    @classmethod
    def from_dict(cls, params_dict: dict, ignore_extra_keys: bool = False) -> Self:
        """Rebuild from a dict ours or nip's; nip's tensor-era and checkpoint settings, and the
        server's (now the run's `server` section), are dropped where they hold their defaults
        and refused otherwise."""
        if isinstance(params_dict, dict):
            params_dict = without_server_settings(without_nip_agent_settings(params_dict))
        return super().from_dict(params_dict, ignore_extra_keys=ignore_extra_keys)

    @classmethod
    def _from_checked_dict(cls, params_dict: dict, kwargs: dict) -> Self:
        flag = params_dict.get("is_random", cls.is_random)
        if flag != cls.is_random:
            raise ValueError(f"is_random={flag!r} does not match {cls.__name__}")
        return super()._from_checked_dict(params_dict, kwargs)

    def load_from_wandb_config(self, wandb_config: Mapping[str, Any]) -> Self:
        """These parameters updated from an agent's settings as a wandb run config stores them.

        nip updates the agent in place; ours are frozen, so this returns a new, validated
        agent. Keys that are not fields (`_type`, `is_random`, nip's checkpoint and tensor-era
        settings, ...) are ignored, except that `is_random` must match.
        """
        flag = wandb_config.get("is_random", self.is_random)
        if flag != self.is_random:
            raise ValueError(f"is_random={flag!r} does not match {type(self).__name__}")
        names = {f.name for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{k: v for k, v in wandb_config.items() if k in names})


@register_parameter_class
@dataclass(frozen=True)
class PureTextAgentParameters(AgentParameters):
    """A text agent that calls a chat-completion API (OpenAI, OpenRouter or self-hosted).

    See the nip API page for field meanings; only one of `temperature`/`top_p` and exactly
    one of `lora_alpha`/`lora_alpha_scale` may be set.
    """

    model_provider: Literal["OpenAI", "SelfHosted", "OpenRouter"] = "OpenAI"
    model_name: str = "gpt-4o-mini-2024-07-18"
    language_model_server_scheme_host: str = "http://localhost"
    language_model_server_port: int = 5000
    use_dummy_api: bool = False
    shared_model_group: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    fine_tune_from_scratch: bool = True
    freeze_agent: bool = False
    quantization: Literal["bitsandbytes", "none"] = "none"
    num_epochs: int | None = None
    dpo_beta: float | None = None
    use_lora: bool = True
    lora_rank: int = 64
    lora_alpha: int | None = None
    lora_alpha_scale: float | None = 1.0
    lora_dropout: float = 0.05
    stack_lora_adapters: bool = False
    per_device_train_batch_size: int = 2
    system_prompt_template_path: str | None = None
    use_supervisor_message: Literal["none", "all", "first", "all_but_first"] = "none"
    supervisor_name: str = "Supervisor"
    max_response_words: int = 150
    max_tokens_per_message: int | None = None
    num_invalid_generation_retries: int = 20
    request_timeout_seconds: float | None = None
    """Seconds one model request may take before it times out (and is retried as transient).

    None keeps the defaults: 900 s for `model_provider="SelfHosted"` (a CPU server answers a
    whole batched tree level in one go) and 120 s for OpenAI/OpenRouter (not the SDK's 600 s,
    so a stuck connection is retried soon). Not a nip field; must be > 0 when set."""
    model_server_replicas: list[str] | None = None
    """Base URLs (`http://host:port/v1`) of several OpenAI-compatible servers that all serve this
    agent's model, e.g. vLLM replicas: chat requests go to the replica with the fewest requests
    in flight, and a request that fails on one is retried on another. Fine-tuning still goes to
    the provider's endpoint. None: the provider's endpoint serves chat too (ours, not nip's)."""
    dpo_loss_type: DpoLossType | None = None
    """TRL's pairwise DPO loss for self-hosted training (None: "sigmoid", the DPO paper's).
    Not a nip field; sent in our server's training extension only."""
    dpo_rpo_alpha: float | None = None
    """Weight of an NLL term on the chosen answer added to the DPO loss (RPO; None or 0: off).
    Guards small models against DPO collapse. Not a nip field; self-hosted training only."""
    gradient_accumulation_steps: int = 1
    """Self-hosted training: batches summed into one optimizer step (ours)."""
    shuffle_training_data: bool = True
    """Self-hosted training: False trains on the rows in their exported order. Label pairs are
    exported alternating the true verdict, so with batch 1 and an even
    `gradient_accumulation_steps` every optimizer step sees as many accepts as rejects and no
    step can move the verdict's bias alone, the flip-flop of batch-1 training (ours)."""
    lora_top_layers: int | None = None
    """Self-hosted training: LoRA on the model's last N transformer layers only (None: all).
    Nothing below them is trained, so the backward pass stops there and a CPU step costs less
    (`bench/dpo_step.py --compare-lora-top-layers N`); the adapter of a job that trains on from an
    earlier one keeps that one's layers (ours)."""
    training_activation_checkpointing: bool | None = None
    """Self-hosted training: recompute activations in the backward pass instead of keeping them.
    None: on a GPU (TRL's default), and on CPU when a batch holds more than 512 tokens
    (SmolLM2-135M keeps ~3.5 MB per token: 3 GiB for one DPO pair of two ~425-token
    conversations); false trains faster where memory allows (ours)."""
    training_stop_at_pair_accuracy: float | None = None
    """Self-hosted DPO: end a job after the first epoch whose pairs it ranks right at this mean
    rate (TRL's `rewards/accuracies` over the epoch), short of `num_epochs`, which stays the most
    it trains; None runs every epoch. Supervised and KTO jobs train every epoch (ours)."""
    training_prompt_gradients: bool = True
    """Self-hosted DPO: False runs each pair's prompt once without gradients, its keys and
    values constants that the answers attend to, so a step trains only the answers' positions
    and skips the prompt's backward pass (`bench/dpo_step.py --compare-prompt-gradients`). Needs
    activations kept (`training_activation_checkpointing` not true). Supervised and KTO jobs
    train as before (ours)."""
    training_precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Self-hosted training: the type of the frozen weights. "auto" takes bf16 where the
    hardware multiplies it natively (a CUDA GPU that has it; a CPU listing AVX512_BF16 or AMX)
    and fp32 elsewhere; LoRA weights and optimizer state are fp32 either way. The job's first
    event names the choice (ours)."""

    @classmethod
    def construct_test_params(cls) -> Self:
        """Defaults, but with the dummy API so tests make no real requests."""
        return cls(use_dummy_api=True)

    @property
    def effective_lora_alpha(self) -> float:
        """The LoRA alpha to use: `lora_alpha`, else `lora_rank * lora_alpha_scale`."""
        if self.lora_alpha is not None:
            return self.lora_alpha
        return self.lora_rank * self.lora_alpha_scale  # type: ignore[operator]

    @property
    def effective_max_tokens(self) -> int:
        """Generation limit: `max_tokens_per_message`, else 1.5 tokens per allowed word."""
        if self.max_tokens_per_message is not None:
            return self.max_tokens_per_message
        return int(1.5 * self.max_response_words)


def _build_agent(name: Any, value: Any, ignore_extra_keys: bool) -> AgentParameters:
    if isinstance(value, AgentParameters):
        return value
    if isinstance(value, Mapping):
        cls = resolve_class(dict(value), AgentParameters)
        if cls is AgentParameters:  # no `_type`: the only concrete agent kind we have
            cls = PureTextAgentParameters
        return cls.from_dict(dict(value), ignore_extra_keys=ignore_extra_keys)
    raise ValueError(f"agent {name!r}: expected agent parameters or a dict, got {value!r}")


@register_parameter_class
class AgentsParameters(dict, ParameterValue):
    """Agent name -> parameters; `"_default"` stands in for any agent not listed.

    Lookup (`[]`, `in`, `get`) falls back to `"_default"`; iteration shows only what is
    stored. Agent names must not be substrings of each other (protocols match on names).
    Like the parameter dataclasses it is immutable: use `with_agent`/`replace_agent`.
    """

    SKIPPED_KEYS: ClassVar[tuple[str, ...]] = (TYPE_KEY, "agents_update_repr")

    def __init__(self, agents: Mapping[str, Any] | None = None, /, **named: Any) -> None:
        items = {**(agents or {}), **named}
        super().__init__({k: _build_agent(k, v, False) for k, v in items.items()})
        validate(self)

    def __getitem__(self, name: str) -> AgentParameters:
        if dict.__contains__(self, name) or not dict.__contains__(self, DEFAULT_AGENT):
            return dict.__getitem__(self, name)
        return dict.__getitem__(self, DEFAULT_AGENT)

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or dict.__contains__(self, DEFAULT_AGENT)

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def __repr__(self) -> str:
        return f"AgentsParameters({dict.__repr__(self)})"

    def _immutable(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("AgentsParameters is immutable: use with_agent or replace_agent")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _immutable
    __ior__ = _immutable

    def __reduce__(self) -> tuple:
        """Pickle and deepcopy through the constructor (item assignment is disabled)."""
        return (type(self), (dict(self),))

    def to_dict(self) -> dict:
        """`{agent_name: agent.to_dict(), ...}`."""
        return {name: agent.to_dict() for name, agent in self.items()}

    @classmethod
    def from_dict(cls, params_dict: Mapping, ignore_extra_keys: bool = False) -> Self:
        """Rebuild from `to_dict` output, each agent dispatched by its `_type` key."""
        if not isinstance(params_dict, Mapping):
            raise ValueError(f"agents must be a mapping, got {type(params_dict).__name__}")
        kept = {k: v for k, v in params_dict.items() if k not in cls.SKIPPED_KEYS}
        return cls({k: _build_agent(k, v, ignore_extra_keys) for k, v in kept.items()})

    @classmethod
    def construct_test_params(cls) -> Self:
        """Every agent uses the dummy-API test parameters."""
        return cls({DEFAULT_AGENT: PureTextAgentParameters.construct_test_params()})

    def with_agent(self, name: str, agent: AgentParameters) -> Self:
        """A copy with `name` set to `agent` (this mapping is left unchanged)."""
        return type(self)({**self, name: agent})

    def replace_agent(self, name: str, **changes: Any) -> Self:
        """A copy where agent `name` (created from `"_default"` if unlisted) has `changes`."""
        return self.with_agent(name, dataclasses.replace(self[name], **changes))
