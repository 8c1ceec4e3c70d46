"""Log-likelihood of an assistant message under a served model (the transformers engine).

The switch guard asks the previous model how likely the new model's messages are: a DPO step
that wrecks a model (word salad, runs of one token) shows as a drop of several nats per token,
even where the game's reward does not notice. Runs on the engine's generation thread.
"""

from __future__ import annotations

from collections.abc import Sequence


def message_logprobs(model, tokenizer, conversations: Sequence[list[dict]], device: str):
    """(sum of token log-probabilities, token count) of each conversation's last message.

    The last message is scored as the reply to the ones before it, rendered by the chat
    template exactly as generation renders a prompt.
    """
    import torch

    results = []
    for conversation in conversations:
        prefix = tokenizer.apply_chat_template(
            conversation[:-1], add_generation_prompt=True, tokenize=False
        )
        prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
        ids = tokenizer(prefix + conversation[-1]["content"], add_special_tokens=False)["input_ids"]
        start = len(prefix_ids)
        if len(ids) <= start:  # an empty message: nothing to score
            results.append((0.0, 0))
            continue
        inputs = torch.tensor([ids], device=device)
        logits = model(input_ids=inputs).logits[0, start - 1 : -1].float()
        targets = inputs[0, start:]
        token_logprobs = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])
        results.append((float(token_logprobs.sum()), int(targets.numel())))
    return results
