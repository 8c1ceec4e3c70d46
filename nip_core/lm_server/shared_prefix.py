"""Run a DPO batch's shared prompt through the model once instead of twice.

TRL batches a preference step as `[chosen rows; rejected rows]`, each row the whole prompt
followed by one answer, so every prompt token goes through the network twice. The verifier's
pairs are ~500 prompt tokens and a few answer tokens ("Decision: accept" over "Decision:
reject"), so nearly half of a step's work is that repeat. A causal model's hidden state at a
position depends only on the tokens up to it, so the rows' common prefix can run once, its
keys and values be handed to both answers, and every hidden state (and gradient: the prefix's
activations receive both rows' gradients, as the duplicated rows' would sum them) is the same
as the duplicated batch's up to float rounding. The backbone of the model is patched, below
TRL's fused LM head, so TRL's loss, metrics and reference log-probabilities are untouched.

With `prompt_gradients` off the prompt runs once without gradients: its keys and values enter
the answers' attention as constants, so a step trains only how the answers read the prompt.
The prompt's backward pass, most of a step's work for the verifier's ~450-token prompts and
~15-token answers, is gone; the answers still see the prompt as the adapter in training encodes
it. The last shared position stays in the graph: it predicts the first token where the two
answers differ, the one token DPO's loss turns on.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used, so importing `training` stays cheap
    import torch

log = logging.getLogger(__name__)

# A shorter common prefix is not worth a second backbone call.
MIN_SHARED_TOKENS = 16


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> int:
    """Tokens every row `i` of the first half shares with row `i` of the second, from the
    start, all of them real (not padding); 0 where the batch is not two equal halves."""
    import torch

    rows = input_ids.shape[0]
    if input_ids.dim() != 2 or rows < 2 or rows % 2:
        return 0
    half = rows // 2
    same = input_ids[:half] == input_ids[half:]
    if attention_mask is not None:
        real = attention_mask.bool()
        same &= real[:half] & real[half:]
    leading = same.to(torch.int32).cumprod(dim=1).sum(dim=1)
    # Keep at least one position per row for the second call.
    return min(int(leading.min()), input_ids.shape[1] - 1)


def _can_share(backbone: torch.nn.Module, input_ids, kwargs: dict[str, Any]) -> bool:
    """Only the plain training/scoring call: ids given, no cache, no explicit positions, and
    no activation checkpointing (which runs without a cache)."""
    if input_ids is None or kwargs.get("inputs_embeds") is not None:
        return False
    if any(kwargs.get(key) is not None for key in ("cache", "past_key_values", "position_ids")):
        return False
    if kwargs.get("use_cache"):
        return False
    return not (getattr(backbone, "gradient_checkpointing", False) and backbone.training)


def declared_cache_keyword(backbone: torch.nn.Module) -> str | None:
    """The keyword the backbone's `forward` takes its KV cache under, read from its signature:
    transformers renamed `past_key_values` to `cache` (5.0 and 5.17 take the old name, 5.24 the
    new one), and a name it does not declare falls silently into `**kwargs`."""
    try:
        parameters = inspect.signature(type(backbone).forward).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def _forward_sharing_prefix(
    original, input_ids, attention_mask, shared: int, kwargs, keyword, frozen: bool = False
):
    """The backbone's output for the whole batch, its first `shared` positions run once (without
    gradients where `frozen`); None where the second call did not extend the prompt's cache (it
    ran without the prompt)."""
    import torch

    half = input_ids.shape[0] // 2
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    # Given here for each call; `_can_share` let through only None for the cache keys.
    kwargs = {k: v for k, v in kwargs.items() if k not in ("use_cache", "cache", "past_key_values")}
    with torch.no_grad() if frozen else contextlib.nullcontext():
        prefix = original(
            input_ids=input_ids[:half, :shared],
            attention_mask=mask[:half, :shared],
            use_cache=True,
            **kwargs,
        )
    cache = prefix.cache if hasattr(prefix, "cache") else getattr(prefix, "past_key_values", None)
    if cache is None or cache.get_seq_length() != shared:
        return None
    both_halves = torch.arange(half, device=input_ids.device).repeat(2)
    cache.reorder_cache(both_halves)
    rest = original(
        input_ids=input_ids[:, shared:],
        attention_mask=mask,
        use_cache=False,
        **{keyword: cache},
        **kwargs,
    )
    # Each layer appends the answers' keys to the cache it attends with.
    if cache.get_seq_length() != input_ids.shape[1]:
        return None
    hidden = torch.cat([prefix.last_hidden_state.repeat(2, 1, 1), rest.last_hidden_state], dim=1)
    return type(rest)(last_hidden_state=hidden)


def share_pair_prefixes(backbone: torch.nn.Module, *, prompt_gradients: bool = True) -> bool:
    """Patch `backbone` (the transformer under the LM head) so that a batch whose halves share
    a prompt runs it once, without gradients unless `prompt_gradients`. Other calls go through
    unchanged. Returns False where it already is. A backbone that cannot take the prompt's cache
    runs every batch unshared (one warning): slower, and with its prompt in the graph.
    """
    if getattr(backbone.forward, "shares_pair_prefixes", False):
        return False
    original = backbone.forward
    keyword = declared_cache_keyword(backbone)

    def unshared(reason: str) -> None:
        nonlocal keyword
        keyword = None
        log.warning(
            "%s: %s; DPO pairs run their prompt twice from now on%s",
            type(backbone).__name__,
            reason,
            "" if prompt_gradients else ", gradients and all",
        )

    if keyword is None:
        unshared("its forward takes neither `cache` nor `past_key_values`")

    @functools.wraps(original)
    def forward(input_ids=None, attention_mask=None, **kwargs):
        import torch

        if keyword is not None and _can_share(backbone, input_ids, kwargs):
            shared = shared_prefix_length(input_ids, attention_mask)
            frozen = not prompt_gradients and torch.is_grad_enabled()
            # Frozen, the last shared position runs with the answers: it predicts their first
            # differing token.
            shared -= int(frozen)
            if shared >= MIN_SHARED_TOKENS:
                output = _forward_sharing_prefix(
                    original, input_ids, attention_mask, shared, kwargs, keyword, frozen
                )
                if output is not None:
                    return output
                unshared(f"its forward did not use the prompt's cache passed as `{keyword}`")
        return original(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    forward.shares_pair_prefixes = True  # type: ignore[attr-defined]
    backbone.forward = forward
    return True


def transformer_backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer under the LM head of `model`, through a PEFT wrapper if there is one."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.base_model
