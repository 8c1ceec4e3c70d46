"""Supervised rows learn the assistant's turns only, as the OpenAI fine-tuning API trains them:
the masks on the embedded model's tokenizer, a template that cannot be split, and the labels the
SFT trainer builds from them on a tiny model."""

from __future__ import annotations

import copy

import pytest

from nip_core.lm_server import training
from nip_core.lm_server.assistant_masks import (
    ChatTemplateError,
    assistant_only_row,
    assistant_only_rows,
)
from nip_core.lm_server.options import TrainingOptions
from tests.tiny_model import build_tiny_model

CONVERSATION = [
    {"role": "system", "content": "You judge Python solutions."},
    {"role": "user", "content": "def add(a, b):\n    return a - b\n\nIs it correct?"},
    {"role": "assistant", "content": "Decision: reject"},
    {"role": "user", "content": "Are you sure?"},
    {"role": "assistant", "content": "Yes, it subtracts."},
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from nip_core.lm_server.embedded_model import embedded_model_path

    return AutoTokenizer.from_pretrained(embedded_model_path())


def learned_text(tokenizer, row: dict) -> str:
    pairs = zip(row["input_ids"], row["assistant_masks"], strict=True)
    return tokenizer.decode([token for token, learned in pairs if learned])


def test_only_the_assistant_turns_are_learned(tokenizer) -> None:
    row = assistant_only_row(tokenizer, CONVERSATION)
    whole = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert tokenizer.decode(row["input_ids"]) == whole  # the row is the conversation, all of it
    assert len(row["assistant_masks"]) == len(row["input_ids"])
    # Each turn's text and its end-of-turn marker (the model learns to stop), nothing else.
    assert learned_text(tokenizer, row) == (
        "Decision: reject<|im_end|>\nYes, it subtracts.<|im_end|>\n"
    )
    first_learned = row["assistant_masks"].index(1)
    assert tokenizer.decode(row["input_ids"][:first_learned]).endswith("<|im_start|>assistant\n")


def test_every_row_is_masked_and_a_row_without_an_answer_is_refused(tokenizer) -> None:
    rows = [{"messages": CONVERSATION[:3]}, {"messages": CONVERSATION}]
    out = assistant_only_rows(tokenizer, rows)
    assert [learned_text(tokenizer, r) for r in out] == [
        "Decision: reject<|im_end|>\n",
        "Decision: reject<|im_end|>\nYes, it subtracts.<|im_end|>\n",
    ]
    empty = [*CONVERSATION[:2], {"role": "assistant", "content": ""}]
    row = assistant_only_row(tokenizer, empty)  # an empty answer still ends its turn
    assert learned_text(tokenizer, row) == "<|im_end|>\n"
    with pytest.raises(ChatTemplateError, match="no assistant tokens"):
        assistant_only_row(tokenizer, CONVERSATION[:2])


def test_a_slow_tokenizer_is_refused_by_name() -> None:
    class SlowTokenizer:
        is_fast = False

    with pytest.raises(ChatTemplateError, match="fast tokenizer.*SlowTokenizer"):
        assistant_only_row(SlowTokenizer(), CONVERSATION)


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer) -> None:
    counting = copy.deepcopy(tokenizer)
    # Renders the number of messages first: no conversation's start is a prefix of the whole.
    counting.chat_template = (
        "{{ messages | length }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="message 2 \\(assistant\\)"):
        assistant_only_row(counting, CONVERSATION)


@pytest.mark.slow
def test_the_sft_trainer_scores_only_the_answers(tmp_path) -> None:
    model_dir = build_tiny_model(tmp_path / "tiny")
    options = TrainingOptions(method="sft", batch_size=2, learning_rate=0.01, lora_rank=4)
    tokenizer = training.load_tokenizer(str(model_dir))
    model, peft, _ = training.load_for_training(str(model_dir), None, options)
    rows = [{"messages": CONVERSATION[:3]}, {"messages": CONVERSATION}]
    trainer = training.build_trainer(options, model, tokenizer, rows, str(tmp_path / "o"), peft)
    batch = next(iter(trainer.get_train_dataloader()))
    for ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), strict=True):
        scored = [t for t, label in zip(ids, labels, strict=True) if label != -100]
        assert [label for label in labels if label != -100] == scored  # labels are the tokens
        text = tokenizer.decode(scored)
        assert text.startswith("Decision: reject<|im_end|>")
        assert "Is it correct?" not in text and "You judge" not in text
    assert trainer.train()  # and it trains on them
