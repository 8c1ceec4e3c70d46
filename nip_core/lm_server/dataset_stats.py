"""Token counts of a training dataset as the TRL trainer will see it, sent as one job event.

A trainer that cannot fit its rows may be training on cut-off examples: TRL truncates every
sequence to `max_length` (1024 by default; our trainer sets the model's context) and drops DPO
examples whose prompt alone fills it.
This counts, per example, the prompt and completion tokens the way TRL 1.16 tokenizes them
(`apply_chat_template` on the prompt with the generation prompt, and on prompt + completion;
the completion starts where the two diverge), and how many examples exceed the maximum.

SFT rows (`messages`) learn every assistant turn (`assistant_masks`); here the prompt is every
message before the last assistant one, only to show how long the answer is.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from typing import Any

DATASET_KIND = "dataset"


def _ids(tokenizer, messages: list[dict], **kwargs: Any) -> list[int]:
    """Token ids of a conversation, as TRL's `_tokenize` renders it."""
    result = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)
    return list(result["input_ids"])


def _common_prefix(ids: Sequence[int], other: Sequence[int]) -> int:
    length = 0
    for a, b in zip(ids, other, strict=False):
        if a != b:
            break
        length += 1
    return length


def _split_sft(messages: list[dict]) -> tuple[list[dict], list[dict]]:
    """(prompt, completion): the completion is the last assistant message and what follows."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:last], messages[last:]


def example_tokens(tokenizer, row: dict, method: str) -> dict[str, int]:
    """One row's counts: prompt, completion (chosen for DPO; KTO's one answer), rejected (DPO)
    and the longest sequence the trainer builds from it (prompt + completion)."""
    if method == "dpo":
        prompt, answers = row["prompt"], {"completion": row["chosen"], "rejected": row["rejected"]}
    elif method == "kto":
        prompt, answers = row["prompt"], {"completion": row["completion"]}
    else:
        prompt, completion = _split_sft(row["messages"])
        answers = {"completion": completion}
    prompt_ids = _ids(tokenizer, prompt, add_generation_prompt=True) if prompt else []
    full = {name: _ids(tokenizer, prompt + answer) for name, answer in answers.items()}
    prompt_len = min(_common_prefix(prompt_ids, ids) for ids in full.values())
    counts = {"prompt": prompt_len}
    counts |= {name: len(ids) - prompt_len for name, ids in full.items()}
    counts["sequence"] = max(len(ids) for ids in full.values())
    return counts


def _mean_max(values: Sequence[int]) -> dict[str, float | int]:
    return {"mean": sum(values) / len(values) if values else 0.0, "max": max(values, default=0)}


def dataset_stats(
    tokenizer,
    rows: Sequence[dict],
    method: str,
    max_length: int | None,
    truncation_mode: str | None = None,
    kept: int | None = None,
) -> dict[str, Any]:
    """The event data: per-example lists, their mean/max, and how many exceed `max_length`.

    `kept`: examples left in the trainer's dataset after its own filtering (DPO drops those
    whose prompt alone fills `max_length`), None when unknown.
    """
    per_example = [example_tokens(tokenizer, row, method) for row in rows]
    columns = ["prompt", "completion", "rejected", "sequence"]
    lists = {c: [e[c] for e in per_example] for c in columns if per_example and c in per_example[0]}
    sequences = lists.get("sequence", [])
    truncated = sum(n > max_length for n in sequences) if max_length is not None else 0
    return {
        "kind": DATASET_KIND,
        "method": method,
        "examples": len(per_example),
        "kept": kept,
        "max_length": max_length,
        "truncation_mode": truncation_mode,
        "truncated": truncated,
        "tokens": {c: _mean_max(values) for c, values in lists.items()},
        "per_example": lists,
    }


def dataset_summary_line(stats: dict[str, Any]) -> str:
    """The event's one-line message."""
    seq = stats["tokens"].get("sequence", {"mean": 0.0, "max": 0})
    return (
        f"Dataset: {stats['examples']} examples, {seq['mean']:.0f} tokens on average "
        f"(max {seq['max']}); {stats['truncated']} longer than max_length {stats['max_length']}"
    )


def trainer_dataset_event(trainer, rows: Sequence[dict], method: str) -> dict[str, Any] | None:
    """`dataset_stats` with the trainer's tokenizer and limits; None (and a traceback on stderr)
    when counting fails, because a diagnostic must never stop a training job."""
    try:
        args = trainer.args
        return dataset_stats(
            trainer.processing_class,
            rows,
            method,
            getattr(args, "max_length", None),
            getattr(args, "truncation_mode", None),
            kept=len(trainer.train_dataset) if trainer.train_dataset is not None else None,
        )
    except Exception:
        traceback.print_exc(file=sys.stderr)
        return None
