"""Tiny randomly initialised chat models with the embedded model's tokenizer, for fast tests.

`build_tiny_model` makes a 2-layer Llama (SmolLM2's architecture); `build_tiny_chat_model`
makes the same size of another family (Qwen2, Gemma 2, Phi-3), each with a chat template in its
family's own turn markers, built locally from a config: nothing is downloaded.
"""

from pathlib import Path

# Turn markers of each family's chat template (Qwen2 uses ChatML, as SmolLM2 does).
CHAT_TEMPLATES = {
    "qwen2": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "gemma2": (
        "{{ bos_token }}{% for m in messages %}<start_of_turn>"
        "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] }}<end_of_turn>\n"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "phi3": (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
}
ARCHITECTURES = tuple(CHAT_TEMPLATES)


def _tokenizer():
    from transformers import AutoTokenizer

    from nip_core.lm_server.embedded_model import embedded_model_path

    return AutoTokenizer.from_pretrained(embedded_model_path())


def _common(tokenizer, heads: int = 4, head_dim: int = 8) -> dict:
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": heads * head_dim,
        "intermediate_size": 2 * heads * head_dim,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": heads // 2,
        "max_position_embeddings": 2048,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": True,
    }


def build_tiny_model(out: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tokenizer()
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**_common(tokenizer))).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_chat_model(
    architecture: str, out: Path, chat_template: bool = True, head_dim: int = 8
) -> Path:
    """A tiny `architecture` model ("qwen2", "gemma2" or "phi3") with its family's template
    (none with `chat_template` False); vLLM's CPU attention needs `head_dim` 32 or more."""
    import torch
    from transformers import (
        Gemma2Config,
        Gemma2ForCausalLM,
        Phi3Config,
        Phi3ForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tokenizer = _tokenizer()
    common = _common(tokenizer, heads=2 if head_dim > 8 else 4, head_dim=head_dim)
    models = {
        "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**common)),
        # Gemma 2 alternates global and sliding-window attention layers and soft-caps logits
        "gemma2": lambda: Gemma2ForCausalLM(
            Gemma2Config(
                **common, head_dim=head_dim, sliding_window=64, final_logit_softcapping=30.0
            )
        ),
        # Phi-3 fuses q/k/v into one projection and gate/up into another
        "phi3": lambda: Phi3ForCausalLM(Phi3Config(**common)),
    }
    torch.manual_seed(0)
    models[architecture]().save_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATES[architecture] if chat_template else None
    tokenizer.save_pretrained(out)
    if not chat_template:  # save_pretrained keeps a template file of the source tokenizer
        for name in ("chat_template.jinja", "chat_template.json"):
            (out / name).unlink(missing_ok=True)
    return out
