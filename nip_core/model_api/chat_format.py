"""Chat-message shapes for the different consumers of a conversation.

Our prompts carry a `name` on messages from other agents (who said it matters in debate). The
OpenAI API takes `name` as is; chat templates of open models drop it, so for them (TRL training
data and the self-hosted server's prompts alike) the speaker's name is folded into the content.
Both sides use `fold_speaker_names`, so a model is trained on exactly what it was shown.
"""

from __future__ import annotations

from collections.abc import Sequence


def fold_speaker_names(messages: Sequence[dict]) -> list[dict]:
    """`{role, content, name}` -> `{role, content}` with "name: " prepended to the content."""
    folded = []
    for message in messages:
        content = message.get("content") or ""
        name = message.get("name")
        if name:
            content = f"{name}: {content}"
        folded.append({"role": message["role"], "content": content})
    return folded


def openai_messages(messages: Sequence[dict]) -> list[dict]:
    """Messages for the OpenAI API: drop empty `name`s, keep everything else."""
    cleaned = []
    for message in messages:
        entry = {"role": message["role"], "content": message.get("content") or ""}
        if message.get("name"):
            entry["name"] = message["name"]
        cleaned.append(entry)
    return cleaned
