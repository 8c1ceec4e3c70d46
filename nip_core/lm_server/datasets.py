"""Validate OpenAI fine-tuning JSONL files and convert them to TRL's conversational format.

Supervised lines look like ``{"messages": [{"role": ..., "content": ...}, ...]}`` and become TRL
language-modelling rows ``{"messages": [...]}``. DPO lines look like ``{"input": {"messages":
[...]}, "preferred_output": [{"role": "assistant", ...}], "non_preferred_output": [...]}`` and
become TRL preference rows ``{"prompt": [...], "chosen": [...], "rejected": [...]}``. KTO lines
(ours: the OpenAI API has no such method) look like ``{"input": {"messages": [...]}, "output":
[{"role": "assistant", ...}], "label": true}`` and become TRL unpaired rows ``{"prompt": [...],
"completion": [...], "label": true}``: one answer, marked desirable or not.

>>> line = '{"input": {"messages": [{"role": "user", "content": "hi"}]}, '
>>> line += '"preferred_output": [{"role": "assistant", "content": "a"}], '
>>> line += '"non_preferred_output": [{"role": "assistant", "content": "b"}]}'
>>> parse_dataset(line, "dpo")[0]["chosen"]
[{'role': 'assistant', 'content': 'a'}]
"""

from __future__ import annotations

import json
from typing import Any

from nip_core.model_api.chat_format import fold_speaker_names
from nip_core.model_api.jsonl import jsonl_lines

METHODS = ("supervised", "dpo", "kto")
_ROLES = ("system", "user", "assistant")


class DatasetError(ValueError):
    """A training file that does not match the OpenAI JSONL shape; the message names the line."""


def parse_dataset(text: str, method: str) -> list[dict]:
    """Validate every line of `text` for `method` and return the TRL rows."""
    if method not in METHODS:
        raise DatasetError(f"unknown fine-tuning method {method!r}; use one of {METHODS}")
    convert = {"supervised": _supervised_row, "dpo": _dpo_row, "kto": _kto_row}[method]
    rows = []
    for number, line in jsonl_lines(text):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"line {number}: not valid JSON ({exc.msg})") from None
        try:
            rows.append(convert(item))
        except DatasetError as exc:
            raise DatasetError(f"line {number}: {exc}") from None
    if not rows:
        raise DatasetError("the training file has no examples")
    return rows


def _message(value: Any, where: str) -> dict:
    """One clean chat message: role and content, with a speaker `name` folded into the content.

    Chat templates drop `name`, so it is folded exactly as the server folds it when generating
    (`fold_speaker_names`): the model is trained on the text it was shown.
    """
    if not isinstance(value, dict):
        raise DatasetError(f"{where} must be an object with 'role' and 'content'")
    role, content = value.get("role"), value.get("content")
    if role not in _ROLES:
        raise DatasetError(f"{where} has role {role!r}; expected one of {_ROLES}")
    if not isinstance(content, str):
        raise DatasetError(f"{where} needs a string 'content'")
    name = value.get("name")
    if name is not None and not isinstance(name, str):
        raise DatasetError(f"{where} has a non-string 'name'")
    return fold_speaker_names([{"role": role, "content": content, "name": name}])[0]


def _messages(value: Any, where: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{where} must be a non-empty list of messages")
    return [_message(m, f"{where}[{i}]") for i, m in enumerate(value)]


def _object(item: Any) -> dict:
    if not isinstance(item, dict):
        raise DatasetError(f"expected a JSON object, got {type(item).__name__}")
    return item


def _supervised_row(item: Any) -> dict:
    messages = _messages(_object(item).get("messages"), "'messages'")
    if not any(m["role"] == "assistant" for m in messages):
        raise DatasetError("'messages' has no assistant message to learn from")
    return {"messages": messages}


def _single_answer(value: Any, where: str) -> list[dict]:
    messages = _messages(value, where)
    if len(messages) != 1 or messages[0]["role"] != "assistant":
        raise DatasetError(f"{where} must hold exactly one assistant message")
    return messages


def _prompt(item: dict) -> list[dict]:
    prompt_holder = item.get("input")
    if not isinstance(prompt_holder, dict):
        raise DatasetError("'input' must be an object with 'messages'")
    return _messages(prompt_holder.get("messages"), "'input.messages'")


def _kto_row(item: Any) -> dict:
    item = _object(item)
    label = item.get("label")
    if not isinstance(label, bool):
        raise DatasetError(f"'label' must be true (desirable) or false, got {label!r}")
    return {
        "prompt": _prompt(item),
        "completion": _single_answer(item.get("output"), "'output'"),
        "label": label,
    }


def _dpo_row(item: Any) -> dict:
    item = _object(item)
    return {
        "prompt": _prompt(item),
        "chosen": _single_answer(item.get("preferred_output"), "'preferred_output'"),
        "rejected": _single_answer(item.get("non_preferred_output"), "'non_preferred_output'"),
    }
