"""Training options of one fine-tuning job, parsed from the OpenAI-shaped create request.

The OpenAI part (`method.<type>.hyperparameters`: n_epochs, beta, batch_size,
learning_rate_multiplier; type "supervised" or "dpo", or our "kto", whose hyperparameters add
desirable_weight and undesirable_weight) and our extension `nip_training` (use_lora, lora_rank,
lora_alpha, lora_dropout, lora_top_layers, stack_lora_adapters, quantization, learning_rate,
seed, loss_type, rpo_alpha, gradient_accumulation_steps, shuffle, activation_checkpointing,
stop_at_pair_accuracy, prompt_gradients, precision) are merged into one frozen record that the
training child receives as JSON. Bad values raise `OptionsError` naming the field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from nip_core.model_api.dpo_losses import LOSS_TYPES

_DEFAULT_LR = {"dpo": 1e-5, "supervised": 2e-5, "kto": 1e-5}
_NIP_FIELDS = (
    "use_lora",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_top_layers",
    "stack_lora_adapters",
    "quantization",
    "learning_rate",
    "seed",
    "loss_type",
    "rpo_alpha",
    "gradient_accumulation_steps",
    "shuffle",
    "activation_checkpointing",
    "stop_at_pair_accuracy",
    "prompt_gradients",
    "precision",
)


QUANTIZATIONS = ("none", "bitsandbytes")
# The frozen weights' type during training: "auto" picks bf16 where the hardware multiplies it
# natively (a CUDA GPU that supports it, a CPU with AVX512_BF16 or AMX), else fp32 (fp16 on an
# older GPU); LoRA weights and optimizer state stay fp32 (`precision.training_precision`).
PRECISIONS = ("auto", "fp32", "bf16")


class OptionsError(ValueError):
    """An invalid training option; the server answers 400 with this message."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class TrainingOptions:
    """Everything the training child needs to know besides the data and the model paths."""

    method: str = "dpo"
    n_epochs: int = 1
    batch_size: int = 2
    learning_rate: float = 1e-5
    beta: float = 0.1
    use_lora: bool = True
    lora_rank: int = 64
    lora_alpha: float = 64.0
    lora_dropout: float = 0.05
    # LoRA on the last N transformer layers only (None: all). Below them nothing is trained, so
    # the backward pass stops there (N = 10 of 30: 0.55 of the all-layer CPU step, benchmarks).
    lora_top_layers: int | None = None
    stack_lora_adapters: bool = False
    quantization: str = "none"
    seed: int = 0
    loss_type: str = "sigmoid"
    rpo_alpha: float = 0.0  # weight of an NLL term on the chosen answer (RPO); 0: plain DPO
    gradient_accumulation_steps: int = 1
    shuffle: bool = True  # False: train on the rows in the order given
    # Recompute activations in the backward pass; None: the trainer decides (on a GPU, and on
    # CPU for batches over `training.CPU_CHECKPOINTING_TOKENS`).
    activation_checkpointing: bool | None = None
    # DPO: end the job after the first epoch whose mean pair accuracy reaches this, short of
    # `n_epochs` (`early_stop`); None: every epoch runs.
    stop_at_pair_accuracy: float | None = None
    # DPO: False runs each pair's shared prompt once without gradients, so only the answers'
    # positions train (`shared_prefix`); never with activation checkpointing, which shares nothing.
    prompt_gradients: bool = True
    precision: str = "auto"  # one of PRECISIONS
    # KTO: the loss weights of desirable and undesirable answers; None: from the labels' counts,
    # so that both kinds weigh the same in all (`training.kto_weights`)
    desirable_weight: float | None = None
    undesirable_weight: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainingOptions:
        return cls(**data)


def _auto(value: Any) -> Any:
    """OpenAI lets every hyperparameter be "auto", which means our default."""
    return None if value == "auto" else value


def _number(value: Any, name: str, kind: type, low: float, high: float | None = None) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OptionsError(f"{name} must be a number, got {value!r}", name)
    if kind is int and int(value) != value:
        raise OptionsError(f"{name} must be an integer, got {value!r}", name)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise OptionsError(f"{name} must be {bounds}, got {value!r}", name)
    return kind(value)


def _method(method: Any) -> tuple[str, dict]:
    """The method type and its hyperparameters dict (supervised when no method is given)."""
    if method is None:
        return "supervised", {}
    if not isinstance(method, dict) or method.get("type") not in _DEFAULT_LR:
        raise OptionsError("method.type must be 'supervised', 'dpo' or 'kto' (ours)", "method")
    kind = method["type"]
    section = method.get(kind) or {}
    hyper = section.get("hyperparameters") or {} if isinstance(section, dict) else None
    if not isinstance(hyper, dict):
        raise OptionsError(f"method.{kind}.hyperparameters must be an object", "method")
    return kind, hyper


def _nip_section(nip: Any) -> dict:
    if nip is None:
        return {}
    if not isinstance(nip, dict):
        raise OptionsError("nip_training must be an object", "nip_training")
    unknown = sorted(set(nip) - set(_NIP_FIELDS))
    if unknown:
        raise OptionsError(
            f"unknown nip_training fields {unknown}; known: {_NIP_FIELDS}", unknown[0]
        )
    return nip


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise OptionsError(f"{name} must be true or false, got {value!r}", name)
    return value


def parse_options(method: Any, nip_training: Any, seed: Any = None) -> TrainingOptions:
    """Merge the OpenAI method block and our `nip_training` extension into `TrainingOptions`."""
    kind, hyper = _method(method)
    nip = _nip_section(nip_training)
    rank = _number(nip.get("lora_rank", 64), "lora_rank", int, 1, 1024)
    alpha = nip.get("lora_alpha")
    lr = nip.get("learning_rate")
    if lr is None:
        multiplier = _auto(hyper.get("learning_rate_multiplier"))
        multiplier = 1.0 if multiplier is None else multiplier
        lr = _DEFAULT_LR[kind] * _number(multiplier, "learning_rate_multiplier", float, 0)
    quantization = nip.get("quantization", "none")
    if quantization not in QUANTIZATIONS:
        raise OptionsError(f"quantization must be one of {QUANTIZATIONS}", "quantization")
    seed = nip.get("seed", seed)
    batch_size = _number(_auto(hyper.get("batch_size")) or 2, "batch_size", int, 1, 4096)
    if kind == "kto" and batch_size < 2:
        raise OptionsError(
            "KTO needs batch_size >= 2: its KL term pairs each answer with another prompt of the "
            "batch",
            "batch_size",
        )
    precision = nip.get("precision", "auto")
    if precision not in PRECISIONS:
        raise OptionsError(f"precision must be one of {PRECISIONS}, got {precision!r}", "precision")
    loss_type = nip.get("loss_type") or "sigmoid"
    if loss_type not in LOSS_TYPES:
        raise OptionsError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}", "loss_type")
    return TrainingOptions(
        method=kind,
        n_epochs=_number(_auto(hyper.get("n_epochs")) or 1, "n_epochs", int, 1, 1000),
        batch_size=batch_size,
        learning_rate=_number(lr, "learning_rate", float, 0, 1),
        beta=_number(_auto(hyper.get("beta")) or 0.1, "beta", float, 0, 2),
        use_lora=_bool(nip.get("use_lora", True), "use_lora"),
        lora_rank=rank,
        lora_alpha=float(rank) if alpha is None else _number(alpha, "lora_alpha", float, 0),
        lora_dropout=_number(nip.get("lora_dropout", 0.05), "lora_dropout", float, 0, 1),
        lora_top_layers=_optional_number(nip.get("lora_top_layers"), "lora_top_layers", int, 1),
        stack_lora_adapters=_bool(nip.get("stack_lora_adapters", False), "stack_lora_adapters"),
        quantization=quantization,
        seed=0 if seed is None else _number(seed, "seed", int, 0),
        loss_type=loss_type,
        rpo_alpha=_number(nip.get("rpo_alpha") or 0.0, "rpo_alpha", float, 0, 100),
        gradient_accumulation_steps=_number(
            nip.get("gradient_accumulation_steps", 1), "gradient_accumulation_steps", int, 1, 4096
        ),
        shuffle=_bool(nip.get("shuffle", True), "shuffle"),
        activation_checkpointing=_optional_bool(
            nip.get("activation_checkpointing"), "activation_checkpointing"
        ),
        stop_at_pair_accuracy=_stop_at_pair_accuracy(kind, nip.get("stop_at_pair_accuracy")),
        prompt_gradients=_prompt_gradients(kind, nip),
        precision=precision,
        **_kto_weights(kind, hyper),
    )


def _prompt_gradients(kind: str, nip: dict) -> bool:
    """Whether the prompt trains; only a DPO pair's prompt, shared by its two answers, can run
    without gradients, and only where activations are kept (checkpointing runs it whole)."""
    prompt_gradients = _bool(nip.get("prompt_gradients", True), "prompt_gradients")
    if prompt_gradients:
        return True
    if kind != "dpo":
        raise OptionsError(
            f"prompt_gradients false needs DPO's shared prompts; method is {kind}",
            "prompt_gradients",
        )
    if nip.get("activation_checkpointing"):
        raise OptionsError(
            "prompt_gradients false cannot run with activation_checkpointing, which runs every "
            "prompt whole",
            "prompt_gradients",
        )
    return False


def _stop_at_pair_accuracy(kind: str, value: Any) -> float | None:
    """The early stop's pair accuracy, in (0, 1]; only DPO logs pair accuracies."""
    if value is None:
        return None
    if kind != "dpo":
        raise OptionsError(
            f"stop_at_pair_accuracy needs DPO's pair accuracies; method is {kind}",
            "stop_at_pair_accuracy",
        )
    threshold = _number(value, "stop_at_pair_accuracy", float, 0, 1)
    if threshold == 0:
        raise OptionsError("stop_at_pair_accuracy must be > 0, got 0", "stop_at_pair_accuracy")
    return threshold


def _kto_weights(kind: str, hyper: dict) -> dict:
    """KTO's desirable/undesirable weights from the method's hyperparameters ("auto" or absent:
    None, set from the labels); other methods take none."""
    names = ("desirable_weight", "undesirable_weight")
    given = {name: _auto(hyper.get(name)) for name in names}
    if kind != "kto":
        extra = [name for name, value in given.items() if value is not None]
        if extra:
            raise OptionsError(f"{extra[0]} is a KTO hyperparameter; method is {kind}", extra[0])
        return {}
    return {
        name: None if value is None else _number(value, name, float, 0, 1000)
        for name, value in given.items()
    }


def _optional_bool(value: Any, name: str) -> bool | None:
    return None if value is None else _bool(value, name)


def _optional_number(value: Any, name: str, kind: type, low: float) -> Any:
    return None if value is None else _number(value, name, kind, low)
