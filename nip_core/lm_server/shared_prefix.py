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

With the prompt trained, each pair runs as one packed row instead of two calls: its prompt, the
chosen remainder, then the rejected one, each answer at the positions it has in its own row and
attending to the prompt and to itself only (a 4-D mask). The second call's cost is overhead, not
arithmetic: 30 layers of products over a few rows and attention over ten queries cost a quarter
of a recipe step on the 2-core CPUs (profiled), for a twentieth of its tokens.
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


def pair_shared_lengths(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor | None:
    """For each pair `i`, the tokens row `i` of the first half shares with row `i` of the
    second, from the start, all of them real (not padding), at most all but the last column;
    None where the batch is not two equal halves."""
    import torch

    rows = input_ids.shape[0]
    if input_ids.dim() != 2 or rows < 2 or rows % 2:
        return None
    half = rows // 2
    same = input_ids[:half] == input_ids[half:]
    if attention_mask is not None:
        real = attention_mask.bool()
        same &= real[:half] & real[half:]
    leading = same.to(torch.int32).cumprod(dim=1).sum(dim=1)
    # Keep at least one position per row for the second call.
    return leading.clamp(max=input_ids.shape[1] - 1)


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


def row_ends(mask: torch.Tensor) -> torch.Tensor:
    """Each right-padded row's real length (0 for a row of padding only)."""
    import torch

    ends = mask.shape[1] - mask.flip(1).to(torch.int64).argmax(dim=1)
    return torch.where(mask.any(dim=1), ends, torch.zeros_like(ends))


def _call_arguments(input_ids, attention_mask, kwargs: dict[str, Any]):
    """The batch's mask (all ones where none was given) and the call's other arguments without
    the cache ones, which each shared call sets itself (`_can_share` let only None through)."""
    import torch

    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    cache_keys = ("use_cache", "cache", "past_key_values")
    return mask, {k: v for k, v in kwargs.items() if k not in cache_keys}


def remainder_positions(mask: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Each row's positions from its `starts` on, as many as the longest remainder of a real
    (right-padded) row needs; past a row's end they run on beyond the batch's width."""
    import torch

    rest_width = int((row_ends(mask)[:, None] - starts).max())
    return starts + torch.arange(rest_width, device=mask.device)


def _forward_sharing_prefix(
    original, input_ids, attention_mask, lengths, kwargs, keyword, frozen: bool = False
):
    """The backbone's output for the whole batch, the first `lengths[i]` positions of pair `i`
    run once (without gradients where `frozen`); None where the second call did not extend the
    prompts' cache (it ran without them).

    Pairs of one batch have prompts of their own lengths: the prompts run as one right-padded
    batch, and each row's remaining tokens (from its pair's shared length on, the padding left
    at the end) as a second, at their own positions, attending to their own prompt only. The
    second call is as wide as the longest remainder, not the batch less the shortest prompt.
    """
    import torch

    rows, width = input_ids.shape
    half = rows // 2
    mask, kwargs = _call_arguments(input_ids, attention_mask, kwargs)
    prompt_width = int(lengths.max())
    prompt_mask = (torch.arange(prompt_width, device=mask.device) < lengths[:, None]).to(mask.dtype)
    with torch.no_grad() if frozen else contextlib.nullcontext():
        prefix = original(
            input_ids=input_ids[:half, :prompt_width],
            attention_mask=prompt_mask,
            use_cache=True,
            **kwargs,
        )
    cache = prefix.cache if hasattr(prefix, "cache") else getattr(prefix, "past_key_values", None)
    if cache is None or cache.get_seq_length() != prompt_width:
        return None
    both_halves = torch.arange(half, device=input_ids.device).repeat(2)
    cache.reorder_cache(both_halves)

    starts = lengths.repeat(2)[:, None]  # each row's first unshared position
    positions = remainder_positions(mask, starts)
    taken = positions.clamp(max=width - 1)
    inside = (positions < width).to(mask.dtype)
    rest = original(
        input_ids=input_ids.gather(1, taken),
        attention_mask=torch.cat([prompt_mask[both_halves], mask.gather(1, taken) * inside], dim=1),
        position_ids=positions,
        use_cache=False,
        **{keyword: cache},
        **kwargs,
    )
    rest_width = positions.shape[1]
    # Each layer appends the answers' keys to the cache it attends with.
    if cache.get_seq_length() != prompt_width + rest_width:
        return None
    hidden = torch.cat([prefix.last_hidden_state[both_halves], rest.last_hidden_state], dim=1)
    if not (lengths == prompt_width).all() or prompt_width + rest_width != width:
        # Back to the batch's columns: a row's own prompt, then its remainder; the columns of
        # padding past the remainder take its last state (no loss reads them).
        column = torch.arange(width, device=input_ids.device)
        index = torch.where(column < starts, column, prompt_width + column - starts)
        index = index.clamp(max=prompt_width + rest_width - 1)
        hidden = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
    return type(rest)(last_hidden_state=hidden)


# The attention implementations that read a custom 4-D mask as given, and the mask each takes.
PACKING_MASKS = {"sdpa": "bool", "eager": "additive"}


def packing_mask_kind(backbone: torch.nn.Module) -> str | None:
    """How `backbone` takes a packed batch's 4-D mask, None where it cannot: an attention
    implementation outside `PACKING_MASKS`, or a sliding window, which builds its own mask."""
    config = getattr(backbone, "config", None)
    if config is None or getattr(config, "sliding_window", None) is not None:
        return None
    return PACKING_MASKS.get(getattr(config, "_attn_implementation", None))


def packed_layout(mask: torch.Tensor, lengths: torch.Tensor):
    """Where each pair's packed row (prompt, chosen remainder, rejected remainder, padding)
    takes its tokens from the `[chosen; rejected]` batch, and where each row of the batch
    reads its states back.

    Returns `(source_rows, source_columns, positions, segments, back_columns)`: the first four
    `[pairs, packed width]` (segment 0 the prompt, 1 chosen, 2 rejected, 3 padding), the last
    `[rows, width]`, an index into the flattened packed states.
    """
    import torch

    rows, width = mask.shape
    half = rows // 2
    ends = row_ends(mask)
    chosen_end = ends[:half]  # in both the row and the packed row
    packed_end = chosen_end + ends[half:] - lengths
    column = torch.arange(int(packed_end.max()), device=mask.device)[None, :]
    in_rejected = (column >= chosen_end[:, None]) & (column < packed_end[:, None])
    segments = torch.where(column < lengths[:, None], 0, torch.where(in_rejected, 2, 1))
    segments = torch.where(column < packed_end[:, None], segments, 3)
    shift = (chosen_end - lengths)[:, None]  # the chosen remainder's length
    source_columns = torch.where(in_rejected, column - shift, column)
    source_columns = torch.where(segments == 3, 0, source_columns)
    pair = torch.arange(half, device=mask.device)[:, None]
    source_rows = torch.where(in_rejected, pair + half, pair)
    # A rejected row reads its answer from after the chosen one; every other column in place.
    row_column = torch.arange(width, device=mask.device)[None, :]
    rejected_row = torch.arange(rows, device=mask.device)[:, None] >= half
    moved = rejected_row & (row_column >= lengths.repeat(2)[:, None])
    back = torch.where(moved, row_column + shift.repeat(2, 1), row_column)
    packed_width = column.shape[1]
    back = back.clamp(max=packed_width - 1) + pair.repeat(2, 1) * packed_width
    # A token's position is its column in its own row.
    return source_rows, source_columns, source_columns, segments, back


def packed_attention_mask(segments: torch.Tensor, kind: str, dtype) -> torch.Tensor:
    """`[pairs, 1, width, width]`: a query sees the keys at or before it in the prompt or in
    its own segment (padding sees the prompt and padding, and no real query sees padding)."""
    import torch

    width = segments.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=segments.device).tril()
    query, key = segments[:, :, None], segments[:, None, :]
    allowed = (causal & ((key == 0) | (key == query)))[:, None]
    if kind == "bool":
        return allowed
    zero = torch.zeros((), dtype=dtype, device=segments.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def _forward_packed(original, input_ids, attention_mask, lengths, kwargs, kind, dtype):
    """The backbone's output for the whole batch, each pair run as one packed row (`dtype`:
    the backbone's compute type, for an additive mask)."""

    mask, kwargs = _call_arguments(input_ids, attention_mask, kwargs)
    source_rows, source_columns, positions, segments, back = packed_layout(mask, lengths)
    packed = original(
        input_ids=input_ids[source_rows, source_columns],
        attention_mask=packed_attention_mask(segments, kind, dtype),
        position_ids=positions,
        use_cache=False,
        **kwargs,
    )
    states = packed.last_hidden_state
    hidden = states.reshape(-1, states.shape[-1])[back.reshape(-1)]
    return type(packed)(last_hidden_state=hidden.view(*back.shape, states.shape[-1]))


def share_pair_prefixes(
    backbone: torch.nn.Module, *, prompt_gradients: bool = True, pack: bool = True
) -> bool:
    """Patch `backbone` (the transformer under the LM head) so that a batch whose halves share
    a prompt runs it once: each pair as one packed row where `pack` and the backbone takes a
    4-D mask, else the prompts then the answers through their cache (the prompt without
    gradients unless `prompt_gradients`). Other calls go through unchanged; False where already
    patched. A backbone that can do neither runs every batch unshared (one warning)."""
    if getattr(backbone.forward, "shares_pair_prefixes", False):
        return False
    original = backbone.forward
    keyword = declared_cache_keyword(backbone)
    # A frozen prompt runs without gradients, which one packed call cannot give it.
    packing = packing_mask_kind(backbone) if pack and prompt_gradients else None

    def unshared(reason: str) -> None:
        nonlocal keyword
        keyword = None
        log.warning(
            "%s: %s; DPO pairs run their prompt twice from now on%s",
            type(backbone).__name__,
            reason,
            "" if prompt_gradients else ", gradients and all",
        )

    if keyword is None and packing is None:
        unshared("its forward takes neither `cache` nor `past_key_values`")

    @functools.wraps(original)
    def forward(input_ids=None, attention_mask=None, **kwargs):
        import torch

        if (keyword or packing) is not None and _can_share(backbone, input_ids, kwargs):
            lengths = pair_shared_lengths(input_ids, attention_mask)
            frozen = not prompt_gradients and torch.is_grad_enabled()
            # Frozen, the last shared position runs with the answers: it predicts their first
            # differing token.
            if lengths is not None and int(lengths.min()) - frozen >= MIN_SHARED_TOKENS:
                if packing is not None:
                    dtype = backbone.get_input_embeddings().weight.dtype
                    args = (original, input_ids, attention_mask, lengths, kwargs, packing, dtype)
                    return _forward_packed(*args)
                output = _forward_sharing_prefix(
                    original,
                    input_ids,
                    attention_mask,
                    lengths - int(frozen),
                    kwargs,
                    keyword,
                    frozen,
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
