"""Refuse a model the server cannot serve, before any weights load or any work starts.

The server renders every chat with the model's chat template and loads the weights as a causal
language model (`AutoModelForCausalLM`), so two things must hold: the tokenizer has a chat
template, and the config names an architecture transformers can load as a causal LM. Anything
else would fail later, halfway through a run (the first chat, or the first training job).
Architecture support comes from transformers itself (Llama, Qwen2, Gemma 2, Phi-3, Mistral,
...); LoRA then targets every linear layer of the transformer blocks, whatever they are called.
"""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """A model the server cannot serve; the message says why and what to change."""


def check_chat_model(model: str, *, config_required: bool = True) -> str | None:
    """The model's architecture name when it can be served; raises `UnsupportedModelError`.

    With `config_required=False` (the vLLM engine, which resolves model names its own way) only
    local files are read, and a config that is not there is left for the engine to report: None."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(model, local_files_only=not config_required)
    except (OSError, ValueError) as error:
        if not config_required:
            return None
        raise UnsupportedModelError(f"model {model!r}: cannot read its config ({error})") from error
    model_type = getattr(config, "model_type", None)
    named = list(getattr(config, "architectures", None) or [])
    architecture = ", ".join(named or [str(model_type)])
    causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
        not named or any(name.endswith(("ForCausalLM", "LMHeadModel")) for name in named)
    )
    if not causal:
        raise UnsupportedModelError(
            f"model {model!r} is a {architecture} (model_type {model_type!r}), not a causal "
            "language model transformers can load; serve a decoder-only chat model (Llama, "
            "Qwen2, Gemma 2, Phi-3, Mistral, ...)"
        )
    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=not config_required)
    if not getattr(tokenizer, "chat_template", None):
        raise UnsupportedModelError(
            f"model {model!r} ({architecture}) has no chat template: the server renders every "
            "chat and training row with it; use the model's instruct/chat version or add a "
            "chat_template to its tokenizer_config.json (or a chat_template.jinja beside it)"
        )
    return architecture
