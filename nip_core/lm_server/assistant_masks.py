"""Supervised rows that learn only what the assistant wrote, as the OpenAI fine-tuning API does.

TRL's `SFTTrainer` trains a `{"messages": [...]}` row on every token unless the chat template
marks the assistant's turns (`{% generation %}`), which SmolLM2's does not: the system prompt,
the question and the code under review then outweigh a verifier's verdict by hundreds of tokens
to a few. Here each row is tokenized once with its chat template and every token outside an
assistant turn is masked (`assistant_masks`, which TRL folds into the labels of a tokenized
row). An assistant turn is what the template adds for that message after the generation prompt
(its text and end-of-turn marker); a template whose rendering of a conversation's start is not
a prefix of the whole cannot be split so and fails with a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence


class ChatTemplateError(ValueError):
    """The chat template cannot be split into turns (its prefixes change as messages follow)."""


def _render(tokenizer, messages: Sequence[dict], *, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=generation_prompt
    )


def assistant_spans(tokenizer, messages: Sequence[dict]) -> tuple[str, list[tuple[int, int]]]:
    """(the conversation's text, the character span of each assistant turn in it)."""
    text = _render(tokenizer, messages, generation_prompt=False)
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = _render(tokenizer, messages[:k], generation_prompt=True) if k else ""
        end = _render(tokenizer, messages[: k + 1], generation_prompt=False)
        if not (end.startswith(start) and text.startswith(end)):
            raise ChatTemplateError(
                f"the chat template does not render message {k} (assistant) as an extension of "
                "the messages before it, so its tokens cannot be told apart for training"
            )
        spans.append((len(start), len(end)))
    return text, spans


def assistant_only_row(tokenizer, messages: Sequence[dict]) -> dict:
    """`{"input_ids", "assistant_masks"}` of one conversation: 1 on the tokens of its assistant
    turns, 0 elsewhere."""
    if not getattr(tokenizer, "is_fast", False):
        raise ChatTemplateError(
            "supervised training needs a fast tokenizer (its character offsets tell the "
            f"assistant's tokens apart); {type(tokenizer).__name__} is not one"
        )
    text, spans = assistant_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [
        int(any(lo <= first < hi for lo, hi in spans) and last > first)
        for first, last in encoded["offset_mapping"]
    ]
    if not any(mask):
        raise ChatTemplateError("the conversation has no assistant tokens to learn from")
    return {"input_ids": list(encoded["input_ids"]), "assistant_masks": mask}


def assistant_only_rows(tokenizer, rows: Sequence[dict]) -> list[dict]:
    """Every `{"messages": [...]}` row as `assistant_only_row` tokenizes it."""
    return [assistant_only_row(tokenizer, row["messages"]) for row in rows]
