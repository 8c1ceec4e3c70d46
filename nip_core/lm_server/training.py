"""The training code path shared by the server's training child and `bench/dpo_step.py`.

It loads the model to train from (a base model, optionally with a previous adapter that is either
re-used or merged and stacked), builds a TRL `DPOTrainer`, `KTOTrainer` or `SFTTrainer` (learning
the assistant's turns only, as the OpenAI API does) with our precision policy, and saves the
result, in the precision `nip_core.lm_server.precision` picks for the machine. torch,
transformers, peft and trl are imported inside the functions so that importing this module
stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nip_core.lm_server.assistant_masks import assistant_only_rows
from nip_core.lm_server.options import OptionsError, TrainingOptions
from nip_core.lm_server.precision import (
    has_cuda,
    precision_args,
    torch_dtype,
    training_precision,
)
from nip_core.lm_server.shared_prefix import share_pair_prefixes, transformer_backbone


def check_runtime(options: TrainingOptions) -> None:
    """Options this machine cannot honour fail before any model is loaded."""
    if options.quantization == "bitsandbytes" and not has_cuda():
        raise OptionsError(
            "quantization 'bitsandbytes' needs a CUDA GPU and none is available here; "
            "use quantization 'none'",
            "quantization",
        )


def lora_config(options: TrainingOptions, model=None):
    """LoRA on every linear layer of the model, or on those of its last `options.lora_top_layers`
    transformer layers (which needs the `model`, to count and name them)."""
    from peft import LoraConfig

    targets: str | list[str] = "all-linear"
    layers = None
    if options.lora_top_layers is not None:
        if model is None:
            raise ValueError("lora_top_layers needs the model, to count its layers")
        blocks = transformer_backbone(model).layers
        layers = top_layers(options.lora_top_layers, len(blocks))
        targets = linear_names(blocks)
    return LoraConfig(
        r=options.lora_rank,
        lora_alpha=options.lora_alpha,
        lora_dropout=options.lora_dropout,
        target_modules=targets,
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )


def top_layers(count: int, num_layers: int) -> list[int]:
    """Indices of the last `count` of `num_layers` layers."""
    if count > num_layers:
        raise OptionsError(
            f"lora_top_layers is {count} but the model has {num_layers} layers", "lora_top_layers"
        )
    return list(range(num_layers - count, num_layers))


def linear_names(blocks) -> list[str]:
    """The names of the linear modules inside the transformer layers `blocks` (q_proj, ...,
    down_proj): PEFT takes `layers_to_transform` only with named targets, not "all-linear"."""
    import torch

    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in blocks.named_modules()
            if isinstance(m, torch.nn.Linear)
        }
    )


def _load_base(path: str, options: TrainingOptions):
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch_dtype(training_precision(options)[0])}
    if options.quantization == "bitsandbytes":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_compute_dtype=kwargs["dtype"]
        )
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if options.quantization == "bitsandbytes":
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model)
    return model


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_for_training(base_path: str, parent: dict | None, options: TrainingOptions):
    """(model, peft_config or None, strategy) for the job.

    With a parent adapter: "reuse" continues training it (TRL then uses it as the reference),
    "stack" merges it into the weights and adds a fresh adapter on top; without LoRA the parent is
    merged and the whole model trained.
    """
    model = _load_base(base_path, options)
    if parent is None:
        peft_config = lora_config(options, model) if options.use_lora else None
        return model, peft_config, "new"
    from peft import PeftModel

    if options.use_lora and not options.stack_lora_adapters:
        return PeftModel.from_pretrained(model, parent["path"], is_trainable=True), None, "reuse"
    merged = PeftModel.from_pretrained(model, parent["path"]).merge_and_unload()
    if not options.use_lora:
        return merged, None, "full"
    return merged, lora_config(options, merged), "stack"


# The reference model never changes during a job, so with more than one epoch its
# log-probabilities are computed once, in one no-grad pass before training, instead of in every
# step of every epoch (the experiments' 4-epoch DPO jobs: 18.7 -> 10.0 s per CPU step). One
# epoch computes them once either way, and keeps the default iteration's path and memory.
PRECOMPUTE_REFERENCE_LOGPS = True


def trainer_config(options: TrainingOptions, output_dir: str, **overrides: Any):
    """The TRL config for `options`: no hub, no reports, no checkpoints, our precision."""
    from trl import DPOConfig, KTOConfig, SFTConfig

    common: dict[str, Any] = {
        "output_dir": output_dir,
        "num_train_epochs": options.n_epochs,
        "per_device_train_batch_size": options.batch_size,
        "learning_rate": options.learning_rate,
        "seed": options.seed,
        "report_to": "none",
        "push_to_hub": False,
        "save_strategy": "no",
        "logging_steps": 1,
        "gradient_accumulation_steps": options.gradient_accumulation_steps,
        "train_sampling_strategy": "random" if options.shuffle else "sequential",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        **precision_args(training_precision(options)[0]),
    }
    if options.method == "dpo":
        # TRL disables dropout so policy and reference agree; keep LoRA dropout when asked for.
        disable = not (options.use_lora and options.lora_dropout > 0)
        reference = {
            "precompute_ref_log_probs": PRECOMPUTE_REFERENCE_LOGPS and options.n_epochs > 1
        }
        losses = dpo_losses(options) | reference
        return DPOConfig(beta=options.beta, disable_dropout=disable, **losses | common | overrides)
    if options.method == "kto":
        # The KL term pairs each answer with the next prompt of its batch, precomputed in a
        # fixed order: TRL needs sequential batches (`kto_training_order` shuffles the rows
        # instead).
        reference = {
            "precompute_ref_log_probs": PRECOMPUTE_REFERENCE_LOGPS and options.n_epochs > 1
        }
        common["train_sampling_strategy"] = "sequential"
        return KTOConfig(beta=options.beta, **reference | common | overrides)
    return SFTConfig(**common | overrides)


def kto_weights(options: TrainingOptions, rows: list[dict]) -> dict[str, float]:
    """KTO's desirable and undesirable loss weights: as asked, else set from the labels so that
    both kinds weigh the same in all (the smaller kind at weight 1; KTO's paper asks for a
    weighted ratio between 1 and 4/3)."""
    desirable = sum(1 for row in rows if row["label"])
    undesirable = len(rows) - desirable
    auto_desirable, auto_undesirable = 1.0, 1.0
    if desirable and undesirable:
        if desirable > undesirable:
            auto_desirable = undesirable / desirable
        else:
            auto_undesirable = desirable / undesirable
    given = options.desirable_weight, options.undesirable_weight
    return {
        "desirable_weight": auto_desirable if given[0] is None else given[0],
        "undesirable_weight": auto_undesirable if given[1] is None else given[1],
    }


def kto_training_order(options: TrainingOptions, rows: list[dict]) -> list[dict]:
    """The rows in training order: as given, or (shuffle) a permutation seeded by the job's seed,
    since KTO's batches must be sequential."""
    if not options.shuffle:
        return list(rows)
    import random

    shuffled = list(rows)
    random.Random(options.seed).shuffle(shuffled)
    return shuffled


def dpo_losses(options: TrainingOptions) -> dict[str, Any]:
    """TRL's loss_type/loss_weights: the pairwise loss, plus an NLL ("sft") term on the chosen
    answer weighted by `rpo_alpha` (RPO), which keeps DPO from pushing both answers' likelihood
    down until a small model writes nonsense."""
    if options.rpo_alpha <= 0:
        return {"loss_type": [options.loss_type]}
    return {"loss_type": [options.loss_type, "sft"], "loss_weights": [1.0, options.rpo_alpha]}


# Without checkpointing, SmolLM2-135M + LoRA keeps ~3.5 MB of activations per batch token on CPU
# (3 GiB for one DPO pair of two ~425-token conversations), so longer batches recompute them.
CPU_CHECKPOINTING_TOKENS = 512


def score_only_labelled_positions() -> None:
    """Make TRL's fused LM head project only completion positions on CPU, as it does on CUDA.

    TRL 1.16 scores every position (prompt and padding included) on devices without Triton, to
    keep tile shapes fixed for compilers; CPU eager mode has no such cost. Scoring all positions
    runs the 49k-wide vocabulary projection over the whole conversation and keeps several
    (tokens x 32k) float32 temporaries alive: about 2 GiB for a DPO pair of ~900-token
    conversations, and a fifth of the step time in `bench/dpo_step.py` (ratio 1.52 -> 1.21).
    The patch only widens the decision `compact = _use_triton(device)` in `trl.trainer.utils`;
    the kernels themselves still pick torch tiles on CPU.
    """
    import trl.trainer.utils as trl_utils

    decide = trl_utils._use_triton
    if getattr(decide, "includes_cpu", False):
        return

    def compact_on_cpu_too(device) -> bool:
        return device.type == "cpu" or decide(device)

    compact_on_cpu_too.includes_cpu = True  # type: ignore[attr-defined]
    trl_utils._use_triton = compact_on_cpu_too


def batch_tokens(tokenizer, rows: list[dict], options: TrainingOptions) -> int:
    """Tokens in the largest batch the trainer can see (longest row x sequences per batch)."""
    longest = 0
    for row in rows:
        answer = row.get("chosen") or row.get("completion") or []
        parts = row.get("messages") or (row.get("prompt", []) + answer)
        text = " ".join(m.get("content") or "" for m in parts)
        longest = max(longest, len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    sequences = options.batch_size * (1 if options.method == "supervised" else 2)
    return longest * sequences


def checkpoints_activations(options: TrainingOptions, tokenizer, rows: list[dict]) -> bool:
    """Whether the job recomputes activations in the backward pass: as asked, else always on a
    GPU (TRL's default) and on CPU when a batch is long. Activations of every layer for a long
    batch dominate CPU memory (see the constant); recomputing them costs about one forward, so a
    machine with memory to spare trains faster with `activation_checkpointing` false."""
    if options.activation_checkpointing is not None:
        return options.activation_checkpointing
    if not options.prompt_gradients:  # the prompt keeps no activations: the answers' are few
        return False
    return has_cuda() or batch_tokens(tokenizer, rows, options) > CPU_CHECKPOINTING_TOKENS


MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"
MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold at 1 MiB for this process, unless the environment sets it.

    By default the threshold rises to the largest block freed so far (up to 32 MiB), after which
    a training step's activations and gradients (1-5 MiB each) come from the heap, whose freed
    pages stay resident: a one-pair DPO step of 812 tokens on CPU peaked at 2.02 GiB RSS, 1.25
    with the threshold fixed (0.47 before the step). Mapping every big block costs page faults,
    so only memory-bound jobs ask for it (`build_trainer`). False where there is no glibc."""
    import ctypes
    import os

    if MMAP_THRESHOLD_ENV in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


# A DPO batch's common prompt runs through the model once (`shared_prefix`); off only to
# measure what it saves (`bench/dpo_step.py --compare-shared-prompt`).
SHARE_PAIR_PROMPTS = True
# Shared, each pair runs as one packed row (prompt, chosen, rejected) rather than its prompt,
# then its answers through the prompt's cache; off only to measure what that saves
# (`bench/dpo_step.py --compare-packed-pairs`).
PACK_PAIR_ANSWERS = True


def context_length(model) -> int | None:
    """The longest sequence the model was built for (None where its config does not say)."""
    config = getattr(model, "config", None)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    return getattr(config, "max_position_embeddings", None)


# LoRA's scaling, casts and sum at the adapter's rank instead of the layer's width
# (`nip_core.lm_server.lean_lora`): the element-wise passes PEFT runs over every adapted layer's
# output cost more than its product on the 2-core CPUs. False: PEFT's own forward.
LEAN_LORA_FORWARD = True


def build_trainer(options, model, tokenizer, rows, output_dir, peft_config=None, callbacks=()):
    """A ready TRL trainer over the TRL-format `rows`."""
    from datasets import Dataset
    from trl import DPOTrainer, KTOTrainer, SFTTrainer

    trainer_cls = {"dpo": DPOTrainer, "kto": KTOTrainer}.get(options.method, SFTTrainer)
    overrides = {}
    if options.method == "kto":
        overrides |= kto_weights(options, rows)
        rows = kto_training_order(options, rows)
    if not has_cuda():
        score_only_labelled_positions()
    # TRL cuts every sequence at 1,024 tokens unless told otherwise, keeping its start: the
    # mixed grade's longest verifier chats (1,150 tokens) lost their verdict, the one thing a
    # verifier's row teaches. Rows are trained whole, up to the model's context.
    overrides["max_length"] = context_length(model)
    # Always said: TRL's configs turn checkpointing on unless told otherwise.
    overrides["gradient_checkpointing"] = checkpoints_activations(options, tokenizer, rows)
    if overrides["gradient_checkpointing"] and not has_cuda():
        return_freed_memory()  # the memory-bound path: the heap must not keep freed steps
    if options.method == "dpo" and SHARE_PAIR_PROMPTS:
        # Before the trainer is built: it computes the reference's log-probabilities there.
        share_pair_prefixes(
            transformer_backbone(model),
            prompt_gradients=options.prompt_gradients,
            pack=PACK_PAIR_ANSWERS,
        )
    if trainer_cls is SFTTrainer:
        # As the OpenAI API trains: the assistant's turns only, not the prompt they answer.
        rows = assistant_only_rows(tokenizer, rows)
    trainer = trainer_cls(
        model=model,
        args=trainer_config(options, output_dir, **overrides),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=list(callbacks),
    )
    if trainer.args.device.type == "cpu":  # GPUs draw dropout masks in parallel already
        from nip_core.lm_server.lora_dropout import use_bulk_random_dropout

        use_bulk_random_dropout(trainer.model)
    if LEAN_LORA_FORWARD:
        from nip_core.lm_server.lean_lora import use_lean_lora_forward

        use_lean_lora_forward(trainer.model)
    return trainer


def save_result(trainer, tokenizer, output_dir: Path, strategy: str, parent: dict | None) -> str:
    """Write the adapter (or full model) and tokenizer; returns "lora" or "full"."""
    model = trainer.model
    if strategy == "full":
        model.save_pretrained(output_dir, safe_serialization=True)
        tokenizer.save_pretrained(output_dir)
        return "full"
    if not hasattr(model, "peft_config"):  # use_lora False without a parent adapter
        model.save_pretrained(output_dir, safe_serialization=True)
        tokenizer.save_pretrained(output_dir)
        return "full"
    target = output_dir / "new" if strategy == "stack" else output_dir
    model.save_pretrained(target, selected_adapters=["default"], safe_serialization=True)
    if strategy == "stack":
        from nip_core.lm_server.stacking import stack_adapters

        stack_adapters(Path(parent["path"]), target, output_dir)
    tokenizer.save_pretrained(output_dir)
    return "lora"
