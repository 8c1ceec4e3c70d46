"""Unit tests of the server's pure parts: dataset validation, option parsing, adapter stacking."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nip_core.lm_server.app import _chat_request
from nip_core.lm_server.datasets import DatasetError, parse_dataset
from nip_core.lm_server.options import OptionsError, TrainingOptions, parse_options
from nip_core.model_api.chat_format import fold_speaker_names

MSG = {"role": "user", "content": "q"}
ANSWER = {"role": "assistant", "content": "a"}


def test_dpo_line_becomes_trl_preference_row():
    line = {"input": {"messages": [MSG]}, "preferred_output": [ANSWER],
            "non_preferred_output": [{"role": "assistant", "content": "b", "extra": 1}]}  # fmt: skip
    (row,) = parse_dataset(json.dumps(line), "dpo")
    assert row == {
        "prompt": [MSG],
        "chosen": [ANSWER],
        "rejected": [{"role": "assistant", "content": "b"}],
    }


def test_supervised_folds_speaker_names_into_the_content():
    line = {"messages": [dict(MSG, name="prover0", extra=1), ANSWER]}
    assert parse_dataset(json.dumps(line) + "\n\n", "supervised") == [
        {"messages": [{"role": "user", "content": "prover0: q"}, ANSWER]}
    ]


def test_speaker_names_reach_generation_and_training_the_same_way():
    """Two provers' messages stay distinguishable to the model, identically in both paths."""
    messages = [
        {"role": "system", "content": "judge"},
        {"role": "user", "content": "yes", "name": "prover0"},
        {"role": "user", "content": "no", "name": "prover1"},
    ]
    served = _chat_request({"messages": messages}, "m").messages
    line = {
        "input": {"messages": messages},
        "preferred_output": [ANSWER],
        "non_preferred_output": [{"role": "assistant", "content": "b"}],
    }
    (trained,) = parse_dataset(json.dumps(line), "dpo")
    assert served == trained["prompt"] == fold_speaker_names(messages)
    assert [m["content"] for m in served] == ["judge", "prover0: yes", "prover1: no"]


@pytest.mark.parametrize(
    ("text", "method", "needle"),
    [
        ("{not json", "supervised", "line 1: not valid JSON"),
        ("[1]", "supervised", "expected a JSON object"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "supervised", "role 'robot'"),
        ('{"messages": [{"role": "user", "content": 3}]}', "supervised", "string 'content'"),
        ("", "dpo", "no examples"),
        (
            '{"input": {"messages": [{"role": "user", "content": "q"}]}, "preferred_output": '
            '[{"role": "user", "content": "a"}], "non_preferred_output": []}',
            "dpo",
            "preferred_output",
        ),  # fmt: skip
    ],
)
def test_malformed_lines_name_the_problem(text, method, needle):
    with pytest.raises(DatasetError, match=needle):
        parse_dataset(text, method)


def test_error_names_the_failing_line_number():
    good = json.dumps({"messages": [MSG, ANSWER]})
    with pytest.raises(DatasetError, match="^line 3: "):
        parse_dataset("\n".join([good, good, '{"messages": []}']), "supervised")


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_line_separators_inside_a_string_stay_in_their_line(separator):
    """JSONL ends a line at "\\n" only: a reply holding U+2028 raw (as `json.dumps(...,
    ensure_ascii=False)` writes it) once split a DPO row in two and failed the job."""
    reply = {"role": "assistant", "content": f"first{separator}second"}
    line = {"input": {"messages": [MSG]}, "preferred_output": [reply],
            "non_preferred_output": [ANSWER]}  # fmt: skip
    text = json.dumps(line, ensure_ascii=False) + "\r\n" + json.dumps(line, ensure_ascii=False)
    rows = parse_dataset(text, "dpo")
    assert [row["chosen"] for row in rows] == [[reply], [reply]]


def test_options_merge_openai_hyperparameters_and_nip_extension():
    method = {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.5, "n_epochs": 3,
              "batch_size": "auto", "learning_rate_multiplier": 2}}}  # fmt: skip
    opts = parse_options(method, {"lora_rank": 16, "stack_lora_adapters": True}, seed=9)
    assert (opts.beta, opts.n_epochs, opts.batch_size) == (0.5, 3, 2)
    assert opts.learning_rate == pytest.approx(2e-5) and opts.lora_alpha == 16.0
    assert opts.stack_lora_adapters and opts.seed == 9
    assert TrainingOptions.from_dict(opts.to_dict()) == opts


def test_explicit_learning_rate_and_alpha_win():
    opts = parse_options(None, {"learning_rate": 0.1, "lora_alpha": 3, "lora_rank": 2})
    assert (opts.method, opts.learning_rate, opts.lora_alpha) == ("supervised", 0.1, 3.0)


@given(st.one_of(st.integers(max_value=0), st.text(), st.booleans(), st.floats(0.1, 0.9)))
def test_invalid_lora_rank_is_rejected_with_its_name(rank):
    with pytest.raises(OptionsError, match="lora_rank") as info:
        parse_options(None, {"lora_rank": rank})
    assert info.value.param == "lora_rank"


def test_stacked_adapter_equals_the_sum_of_both(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from nip_core.lm_server.stacking import stack_adapters

    torch.manual_seed(0)
    key = "base_model.model.layers.0.q_proj"
    adapters = []
    for name, rank, alpha, extra in (("one", 2, 4, False), ("two", 3, 3, True)):
        weights = {f"{key}.lora_A.weight": torch.randn(rank, 5),
                   f"{key}.lora_B.weight": torch.randn(7, rank)}  # fmt: skip
        if extra:
            weights |= {f"{key[:-6]}v_proj.lora_A.weight": torch.randn(rank, 5),
                        f"{key[:-6]}v_proj.lora_B.weight": torch.randn(4, rank)}  # fmt: skip
        (tmp_path / name).mkdir()
        save_file(weights, str(tmp_path / name / "adapter_model.safetensors"))
        (tmp_path / name / "adapter_config.json").write_text(
            json.dumps({"r": rank, "lora_alpha": alpha})
        )
        adapters.append((weights, alpha / rank))
    stack_adapters(tmp_path / "one", tmp_path / "two", tmp_path / "out")
    from safetensors.torch import load_file

    out = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert config["r"] == config["lora_alpha"] == 5
    assert config["target_modules"] == ["q_proj", "v_proj"]

    def delta(weights, module):
        return weights[f"{module}.lora_B.weight"] @ weights[f"{module}.lora_A.weight"]

    expected = sum(delta(w, key) * s for w, s in adapters)
    assert torch.allclose(delta(out, key), expected, atol=1e-5)
    v_key = key[:-6] + "v_proj"
    assert torch.allclose(
        delta(out, v_key), delta(adapters[1][0], v_key) * adapters[1][1], atol=1e-5
    )


def test_rpo_alpha_adds_an_sft_term_on_the_chosen_answer():
    from nip_core.lm_server.training import dpo_losses, trainer_config

    plain = parse_options({"type": "dpo"}, {})
    assert (plain.loss_type, plain.rpo_alpha) == ("sigmoid", 0.0)
    assert dpo_losses(plain) == {"loss_type": ["sigmoid"]}
    rpo = parse_options({"type": "dpo"}, {"rpo_alpha": 0.5, "loss_type": "ipo"})
    config = trainer_config(rpo, "/tmp/unused-output")
    assert config.loss_type == ["ipo", "sft"] and config.loss_weights == [1.0, 0.5]
    with pytest.raises(OptionsError, match="loss_type"):
        parse_options({"type": "dpo"}, {"loss_type": "nope"})
    with pytest.raises(OptionsError, match="rpo_alpha"):
        parse_options({"type": "dpo"}, {"rpo_alpha": -1})


def test_activation_checkpointing_is_as_asked_else_by_batch_length_on_cpu(monkeypatch):
    from nip_core.lm_server import training

    monkeypatch.setattr(training, "has_cuda", lambda: False)
    monkeypatch.setattr(training, "batch_tokens", lambda tokenizer, rows, options: 600)
    auto = parse_options({"type": "dpo"}, {})
    assert auto.activation_checkpointing is None
    assert training.checkpoints_activations(auto, None, []) is True  # 600 > 512 on CPU
    monkeypatch.setattr(training, "batch_tokens", lambda tokenizer, rows, options: 400)
    assert training.checkpoints_activations(auto, None, []) is False
    for asked in (True, False):
        options = parse_options({"type": "dpo"}, {"activation_checkpointing": asked})
        assert training.checkpoints_activations(options, None, []) is asked
    monkeypatch.setattr(training, "has_cuda", lambda: True)
    assert training.checkpoints_activations(auto, None, []) is True  # TRL's default on a GPU
    with pytest.raises(OptionsError, match="activation_checkpointing"):
        parse_options({"type": "dpo"}, {"activation_checkpointing": "no"})


def test_dpo_jobs_of_several_epochs_compute_the_reference_log_probabilities_once():
    from nip_core.lm_server.training import trainer_config

    def precomputes(epochs: int) -> bool:
        method = {"type": "dpo", "dpo": {"hyperparameters": {"n_epochs": epochs}}}
        return trainer_config(parse_options(method, {}), "/tmp/unused").precompute_ref_log_probs

    assert precomputes(4) is True and precomputes(1) is False  # one epoch: once either way


def test_kto_rows_parse_and_their_weights_follow_the_labels():
    from nip_core.lm_server.training import kto_training_order, kto_weights
    from tests.conftest_lm import kto_lines

    rows = parse_dataset("\n".join(json.dumps(line) for line in kto_lines(9)), "kto")
    assert rows[0]["completion"] == [{"role": "assistant", "content": "Yes."}]
    assert [row["label"] for row in rows].count(True) == 6
    options = TrainingOptions(method="kto")
    assert kto_weights(options, rows) == {"desirable_weight": 0.5, "undesirable_weight": 1.0}
    given = TrainingOptions(method="kto", undesirable_weight=2.0)
    assert kto_weights(given, rows)["undesirable_weight"] == 2.0
    assert kto_training_order(TrainingOptions(method="kto", shuffle=False), rows) == rows
    shuffled = kto_training_order(TrainingOptions(method="kto", seed=1), rows)
    assert shuffled != rows and sorted(map(str, shuffled)) == sorted(map(str, rows))
    bad = json.dumps({**kto_lines(1)[0], "label": "yes"})
    with pytest.raises(DatasetError, match="line 1: 'label' must be true"):
        parse_dataset(bad, "kto")
