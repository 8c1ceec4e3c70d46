"""The switch guard keeps the previous model when the fine-tuned one scores worse."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import nip_core.training.switch_guard_stage as guard_stage
from flows.cli import open_run, resolve_hyper_params
from flows.malt_iteration import malt_iteration
from flows.malt_run import malt_run
from nip_core.parameters import load_hyper_params
from nip_core.training.switch_guard import (
    KEPT_PREVIOUS,
    SWITCHED,
    drift,
    group_score,
    guard_verdict,
    guarded_models,
    logprob_per_token,
    reward_verdict,
    verdict_share,
)

BASE = [
    "agents._default.use_dummy_api=true",
    "interaction_protocol=solo_verifier",
    "rl.rollouts_per_iteration=8",
    "pure_text_malt.num_responses_per_timestep=4",
    "text_rl.validation_fraction=0.3",
    "text_rl.switch_guard_episodes=6",
    "text_rl.switch_guard=false",
]
GUARDED = [*BASE, "text_rl.switch_guard=true"]


def manifest(root: Path, run: str) -> dict:
    return json.loads((root / run / "iterations" / "0000" / "manifest.json").read_text())


def test_verdict_and_models_by_hand():
    assert reward_verdict(0.5, 0.44, margin=0.05) == KEPT_PREVIOUS
    assert reward_verdict(0.5, 0.46, margin=0.05) == SWITCHED
    assert reward_verdict(0.5, 0.9, margin=0.0) == SWITCHED
    assert group_score({"a": 1.0, "b": None}, ["a", "b"]) == 0.5
    assert guarded_models(
        {"g": "old", "h": "old-h"},
        {"g": "new", "h": "new-h"},
        {"g": KEPT_PREVIOUS, "h": SWITCHED},
    ) == {"g": "old", "h": "new-h"}


def fake_scores(previous: float, new: float, calls: list[str]):
    def score(paths, context, group_models, label):
        calls.append(label)
        return {"verifier": previous if label == "previous" else new}, {}, ([], [])

    return score


@pytest.mark.parametrize(
    ("new", "expected"), [(0.1, KEPT_PREVIOUS), (0.6, SWITCHED), (0.58, SWITCHED)]
)
def test_guard_keeps_or_switches_and_records_both_scores(
    prefect_harness, tmp_path, monkeypatch, new, expected
):
    calls: list[str] = []
    monkeypatch.setattr(guard_stage, "score_models", fake_scores(0.6, new, calls))
    stats = malt_iteration(overrides=GUARDED, run_name="g", artifacts_root=str(tmp_path))
    entry = manifest(tmp_path, "g")["stages"]["switch_guard"]["info"]["verifier"]
    assert (entry["previous_score"], entry["new_score"], entry["verdict"]) == (0.6, new, expected)
    assert entry["new_model"].startswith("dummy-ft:verifier")
    kept = entry["previous_model"] if expected == KEPT_PREVIOUS else entry["new_model"]
    assert stats["models_after"]["verifier"] == kept
    assert manifest(tmp_path, "g")["models_after"]["verifier"] == kept
    # The previous models' scoring is played beside the rollouts, then replayed by the guard.
    assert calls == ["previous", "previous", "verifier"]
    assert entry["scored"] == "alone"  # one changed group: scored beside the previous others


def test_without_the_guard_the_switch_always_happens(prefect_harness, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the guard must not score anything when it is off")

    monkeypatch.setattr(guard_stage, "score_models", refuse)
    stats = malt_iteration(overrides=BASE, run_name="off", artifacts_root=str(tmp_path))
    assert stats["models_after"]["verifier"].startswith("dummy-ft:verifier")
    assert "switch_guard" not in manifest(tmp_path, "off")["stages"]


def test_guard_scores_real_validation_episodes(prefect_harness, tmp_path):
    malt_iteration(overrides=GUARDED, run_name="real", artifacts_root=str(tmp_path))
    it = tmp_path / "real" / "iterations" / "0000"
    entry = manifest(tmp_path, "real")["stages"]["switch_guard"]["info"]["verifier"]
    assert entry["verdict"] in (SWITCHED, KEPT_PREVIOUS)
    assert isinstance(entry["previous_score"], float) and isinstance(entry["new_score"], float)
    assert (it / "guard-previous.parquet").exists() and (it / "guard-verifier.parquet").exists()


def journal_keys(folder: Path) -> set[str]:
    lines = [
        line for p in folder.glob("guard-calls-*.jsonl") for line in p.read_text().splitlines()
    ]
    return {json.loads(line)["key"] for line in lines}


def test_the_next_iteration_replays_the_guard_calls_of_the_model_it_starts_from(
    prefect_harness, tmp_path
):
    """The previous model of iteration 1 was scored in iteration 0 (as the new model, or as the
    previous one when kept) on the same episodes with the same call seeds: not asked again."""
    overrides = [*GUARDED, "rl.num_iterations=2"]
    malt_run(overrides=overrides, run_name="two", artifacts_root=str(tmp_path), use_wandb=False)
    first, second = (tmp_path / "two" / "iterations" / f"000{i}" for i in (0, 1))
    verdict = json.loads((first / "manifest.json").read_text())["stages"]["switch_guard"]
    kept = verdict["info"]["verifier"]["verdict"] == KEPT_PREVIOUS
    earlier, own = journal_keys(first), journal_keys(second)
    assert earlier and own and not earlier & own  # only the new model's calls were made
    scored_before = pd.read_parquet(first / f"guard-{'previous' if kept else 'verifier'}.parquet")
    scored_again = pd.read_parquet(second / "guard-previous.parquet")
    assert scored_again["decision"].tolist() == scored_before["decision"].tolist()


def test_a_label_balanced_guard_plays_as_many_correct_as_buggy_solutions(prefect_harness, tmp_path):
    overrides = [*GUARDED, "text_rl.switch_guard_balance_labels=true"]
    malt_iteration(overrides=overrides, run_name="balanced", artifacts_root=str(tmp_path))
    it = tmp_path / "balanced" / "iterations" / "0000"
    for name in ("guard-previous.parquet", "guard-verifier.parquet"):
        labels = pd.read_parquet(it / name)["y"].tolist()
        assert len(labels) == 6 and labels.count(1) == labels.count(0) == 3, name


def test_guard_needs_a_validation_split(tmp_path):
    config = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"
    with pytest.raises(ValueError, match="validation_fraction"):
        load_hyper_params(config, ["text_rl.switch_guard=true", "text_rl.validation_fraction=0"])


def test_guard_keeps_the_previous_model_when_its_replies_drift(
    prefect_harness, tmp_path, monkeypatch
):
    """A better reward does not save a model whose replies the previous model finds absurd."""
    reply = lambda text: [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]  # noqa: E731

    def score(paths, context, group_models, label):
        text = "Decision: accept" if label == "previous" else "salad salad salad"
        replies = {"verifier": [reply(text)] * 3}
        return {"verifier": 0.0 if label == "previous" else 0.5}, replies, ([], [])

    def score_replies(params, model, conversations):
        assert model == "SmolLM2-135M-Instruct"  # always under the previous model
        words = [len(c[-1]["content"].split()) for c in conversations]
        per = [9.0 if "salad" in c[-1]["content"] else 1.5 for c in conversations]
        return [(-p * n, n) for p, n in zip(per, words, strict=True)]

    monkeypatch.setattr(guard_stage, "score_models", score)
    monkeypatch.setattr(guard_stage, "score_replies", score_replies)
    for max_drift, expected, reason in [(2.0, KEPT_PREVIOUS, "drift"), (8.0, SWITCHED, None)]:
        run = f"drift{max_drift}"
        overrides = [*GUARDED, f"text_rl.switch_guard_max_drift={max_drift}"]
        stats = malt_iteration(overrides=overrides, run_name=run, artifacts_root=str(tmp_path))
        entry = manifest(tmp_path, run)["stages"]["switch_guard"]["info"]["verifier"]
        assert (entry["previous_score"], entry["new_score"]) == (0.0, 0.5)
        assert entry["previous_logprob_per_token"] == pytest.approx(-1.5)
        assert entry["new_logprob_per_token"] == pytest.approx(-9.0)
        assert entry["drift"] == pytest.approx(7.5) and entry["max_drift"] == max_drift
        assert (entry["verdict"], entry["reason"]) == (expected, reason)
        kept = entry["previous_model"] if expected == KEPT_PREVIOUS else entry["new_model"]
        assert stats["models_after"]["verifier"] == kept


def test_guard_verdict_reasons_by_hand():
    assert guard_verdict(0.5, 0.1, 0.05, drift_nats=0.0, max_drift=1.0) == (KEPT_PREVIOUS, "reward")
    assert guard_verdict(0.5, 0.9, 0.05, drift_nats=1.5, max_drift=1.0) == (KEPT_PREVIOUS, "drift")
    assert guard_verdict(0.5, 0.9, 0.05, drift_nats=1.5, max_drift=None) == (SWITCHED, None)
    assert guard_verdict(0.5, 0.9, 0.05, drift_nats=None, max_drift=1.0) == (SWITCHED, None)
    assert logprob_per_token([(-3.0, 2), (-1.0, 2)]) == -1.0
    assert logprob_per_token([]) is None and drift(None, -1.0) is None
    assert drift(-1.5, -4.0) == 2.5


def test_verdict_share_by_hand():
    labels = [1, 0, 1, 0, 1, 0]
    assert verdict_share([1, 1, 1, 1, None, 1], labels, 0.9) == 1.0
    assert verdict_share([1, 0, 1, 1, None, None], labels, 0.9) == 0.75
    assert verdict_share([None] * 6, labels, 0.9) is None  # nothing decided
    assert verdict_share([1] * 10, [1] * 9 + [0], 0.9) is None  # labels 90 % one: uninformative
    assert guard_verdict(0.5, 0.9, 0.05, share=0.95, max_share=0.9) == (
        KEPT_PREVIOUS,
        "constant_verdict",
    )
    assert guard_verdict(0.5, 0.9, 0.05, share=0.85, max_share=0.9) == (SWITCHED, None)
    assert guard_verdict(0.5, 0.9, 0.05, share=1.0, max_share=None) == (SWITCHED, None)


def test_guard_keeps_the_previous_model_when_the_new_one_always_accepts(
    prefect_harness, tmp_path, monkeypatch
):
    """A fine-tuned dummy that accepts every episode wins on reward against a base that often
    does not decide, and is still kept out, with the reason in the manifest."""
    from nip_core.agents.dummy_client import DummyChatClient

    plain = DummyChatClient.complete

    async def complete(self, messages, model, n, sampling):
        if model.startswith("dummy-ft") and "Decision: accept" in messages[0]["content"]:
            return ["Decision: accept"] * n
        return await plain(self, messages, model, n, sampling)

    monkeypatch.setattr(DummyChatClient, "complete", complete)
    for share, expected, reason in [(0.9, KEPT_PREVIOUS, "constant_verdict"), (None, None, None)]:
        run = f"const{share}"
        overrides = [
            *GUARDED,
            "text_rl.switch_guard_max_drift=null",
            "text_rl.switch_guard_margin=1.0",  # the reward check never objects
            f"text_rl.switch_guard_max_verdict_share={'null' if share is None else share}",
        ]
        stats = malt_iteration(overrides=overrides, run_name=run, artifacts_root=str(tmp_path))
        entry = manifest(tmp_path, run)["stages"]["switch_guard"]["info"]["verifier"]
        if share is None:
            assert entry["verdict_share"] is None and entry["verdict"] == SWITCHED
            assert stats["models_after"]["verifier"] == entry["new_model"]
            continue
        assert entry["verdict_share"] == 1.0 and entry["max_verdict_share"] == share
        assert (entry["verdict"], entry["reason"]) == (expected, reason)
        assert stats["models_after"]["verifier"] == entry["previous_model"]


NIP = [*GUARDED, "interaction_protocol=nip", "text_rl.switch_guard_max_drift=null"]


def scores_by_new_groups(verifier_with_both: float, calls: list[str]):
    """Per agent: the verifier 0.6, 0.7 fine-tuned, `verifier_with_both` when the prover is
    fine-tuned too; the prover 0.2, 0.4 fine-tuned."""

    def score(paths, context, group_models, label):
        calls.append(label)
        new = {g for g, model in group_models.items() if model.startswith("dummy-ft")}
        verifier = 0.6
        if "verifier" in new:
            verifier = verifier_with_both if "prover" in new else 0.7
        return {"verifier": verifier, "prover": 0.4 if "prover" in new else 0.2}, {}, ([], [])

    return score


@pytest.mark.parametrize(
    ("verifier_with_both", "expected_calls", "verifier_scored"),
    [
        (0.7, ["previous", "previous", "together"], "together"),
        (0.3, ["previous", "previous", "together", "verifier"], "alone"),
    ],
)
def test_two_trained_groups_are_scored_together_and_alone_only_where_that_fails(
    prefect_harness, tmp_path, monkeypatch, verifier_with_both, expected_calls, verifier_scored
):
    """Two scorings decide both groups when their candidates pass together; a group that fails
    beside the other's candidate is judged alone, beside the other group's previous model."""
    calls: list[str] = []
    monkeypatch.setattr(
        guard_stage, "score_models", scores_by_new_groups(verifier_with_both, calls)
    )
    stats = malt_iteration(overrides=NIP, run_name="two", artifacts_root=str(tmp_path))
    info = manifest(tmp_path, "two")["stages"]["switch_guard"]["info"]
    assert set(info) == {"prover", "verifier"}, "both groups must be fine-tuned for this test"
    assert calls == expected_calls
    assert (info["prover"]["scored"], info["prover"]["new_score"]) == ("together", 0.4)
    assert (info["verifier"]["scored"], info["verifier"]["new_score"]) == (verifier_scored, 0.7)
    for group in ("prover", "verifier"):
        assert info[group]["verdict"] == SWITCHED
        assert stats["models_after"][group] == info[group]["new_model"]


def test_two_trained_groups_play_real_episodes_together(prefect_harness, tmp_path):
    malt_iteration(overrides=NIP, run_name="real2", artifacts_root=str(tmp_path))
    it = tmp_path / "real2" / "iterations" / "0000"
    info = manifest(tmp_path, "real2")["stages"]["switch_guard"]["info"]
    assert set(info) == {"prover", "verifier"}
    assert (it / "guard-together.parquet").exists()
    together = pd.read_parquet(it / "guard-together.parquet")
    assert len(together) == 6
    for group, entry in info.items():
        alone = it / f"guard-{group}.parquet"
        assert alone.exists() == (entry["scored"] == "alone"), group


def test_the_previous_scoring_played_ahead_leaves_the_guard_nothing_to_ask(
    prefect_harness, tmp_path
):
    """`score_previous_models` (run beside the rollouts) journals the previous models' scoring:
    the guard's own scoring of them then makes no model call. Here on a finished iteration with
    the guard's calls and manifest entry removed, as if the guard had not run yet."""
    from nip_core.agents.dummy_client import DummyChatClient

    malt_iteration(overrides=GUARDED, run_name="ahead", artifacts_root=str(tmp_path))
    it = tmp_path / "ahead" / "iterations" / "0000"
    for journal in it.glob("guard-calls-*.jsonl"):
        journal.unlink()
    entries = json.loads((it / "manifest.json").read_text())
    del entries["stages"]["switch_guard"]
    (it / "manifest.json").write_text(json.dumps(entries))
    asked: list[str] = []
    plain = DummyChatClient.complete

    async def complete(self, messages, model, n, sampling):
        asked.append(model)
        return await plain(self, messages, model, n, sampling)

    hp = resolve_hyper_params(None, GUARDED)
    with open_run(hp, str(tmp_path), "ahead") as run, pytest.MonkeyPatch.context() as patch:
        context = run.context(0)
        patch.setattr(DummyChatClient, "complete", complete)
        assert guard_stage.score_previous_models(run.paths, context) is True
        played = len(asked)
        guard_stage.score_models(run.paths, context, dict(context.group_models), "previous")
    assert played > 0 and len(asked) == played


def test_nothing_is_played_ahead_of_a_guard_that_is_off_or_done(prefect_harness, tmp_path):
    for run_name, overrides in [("off", BASE), ("done", GUARDED)]:
        malt_iteration(overrides=overrides, run_name=run_name, artifacts_root=str(tmp_path))
        hp = resolve_hyper_params(None, overrides)
        with open_run(hp, str(tmp_path), run_name) as run:
            assert guard_stage.score_previous_models(run.paths, run.context(0)) is False
