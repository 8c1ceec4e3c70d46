"""Log-likelihood of an assistant message under a served model (the transformers engine).

The switch guard asks the previous model how likely the new model's messages are: a DPO step
that wrecks a model (word salad, runs of one token) shows as a drop of several nats per token,
even where the game's reward does not notice; the experiments read the verifier's P(accept)
the same way. Conversations are scored in batches, left padded, one forward each: the batch
is bounded by the engine's token budget and by the logits it keeps (only the last message's
positions, at most LOGIT_BUDGET floats). Runs on the engine's generation thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LOGIT_BUDGET = 2**25  # floats of log-probabilities per forward (128 MiB)


def scored_tokens(tokenizer, conversation: list[dict]) -> tuple[list[int], int]:
    """(token ids of the whole conversation, how many at the end are its last message).

    The last message is scored as the reply to the ones before it, rendered by the chat
    template exactly as generation renders a prompt.
    """
    prefix = tokenizer.apply_chat_template(
        conversation[:-1], add_generation_prompt=True, tokenize=False
    )
    start = len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    ids = tokenizer(prefix + conversation[-1]["content"], add_special_tokens=False)["input_ids"]
    return ids, min(max(len(ids) - start, 0), len(ids) - 1)  # the first token has no context


def score_batches(
    shapes: Sequence[tuple[int, int]], max_tokens: int, vocabulary: int
) -> list[list[int]]:
    """Indices of conversations ((tokens, scored tokens) each) grouped for one forward each:
    similar lengths together, every group within `max_tokens` padded tokens and LOGIT_BUDGET
    kept logits; a conversation over either budget gets a group of its own."""
    order = sorted(range(len(shapes)), key=lambda i: shapes[i])
    groups: list[list[int]] = []
    widest = kept = 0
    for i in order:
        width, scored = shapes[i]
        grown = (max(widest, width), max(kept, scored + 1))
        members = len(groups[-1]) + 1 if groups else 1
        fits = members * grown[0] <= max_tokens and members * grown[1] * vocabulary <= LOGIT_BUDGET
        if groups and fits:
            groups[-1].append(i)
            widest, kept = grown
        else:
            groups.append([i])
            widest, kept = width, scored + 1
    return groups


def _batch_logprobs(model, rows: list[list[int]], scored: list[int], device) -> torch.Tensor:
    """Sum of the log-probabilities of each row's last `scored` tokens, in one forward."""
    import torch

    width, kept = max(len(r) for r in rows), max(scored) + 1
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 1)
    logits = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=kept
    ).logits
    # Position j of the kept logits predicts token width - kept + j + 1.
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    targets = ids[:, width - kept + 1 :]
    token_logprobs = logprobs.gather(2, targets[..., None])[..., 0]
    column = torch.arange(kept - 1, device=device)[None, :]
    wanted = column >= (kept - 1 - torch.tensor(scored, device=device))[:, None]
    return torch.where(wanted, token_logprobs, 0.0).sum(-1)  # padding may hold NaN


def message_logprobs(
    model, tokenizer, conversations: Sequence[list[dict]], device, max_tokens: int = 16_384
) -> list[tuple[float, int]]:
    """(sum of token log-probabilities, token count) of each conversation's last message."""
    encoded = [scored_tokens(tokenizer, c) for c in conversations]
    results = [(0.0, 0)] * len(encoded)  # an empty message: nothing to score
    live = [i for i, (_, scored) in enumerate(encoded) if scored]
    shapes = [(len(encoded[i][0]), encoded[i][1]) for i in live]
    vocabulary = model.get_output_embeddings().weight.shape[0]
    for group in score_batches(shapes, max_tokens, vocabulary):
        members = [live[g] for g in group]
        sums = _batch_logprobs(
            model, [encoded[i][0] for i in members], [encoded[i][1] for i in members], device
        )
        for i, total in zip(members, sums.tolist(), strict=True):
            results[i] = (total, encoded[i][1])
    return results
