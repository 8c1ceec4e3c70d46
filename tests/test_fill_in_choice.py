"""Fill-in by choice: the verifier's reply is one of the two versions of the missing part,
drawn by the served model's score of each (our server's `candidates` extension)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from nip_core.agents import chat_messages
from nip_core.agents.call_journal import call_key
from nip_core.agents.chat_client import SamplingParams, request_digest
from nip_core.agents.chat_replies import request_body
from nip_core.agents.dummy_client import DummyChatClient
from nip_core.agents.http_client import DirectHttpChatClient
from nip_core.agents.prompts import verdict_reply
from nip_core.agents.respond import generate_responses, reply_candidates
from nip_core.episode import ACCEPT, REJECT
from nip_core.lm_server.candidates import (
    candidate_scores,
    check_candidates,
    choice_probabilities,
    draw_candidates,
)
from nip_core.protocols import make_protocol
from tests.conftest_lm import running_server
from tests.test_fill_in import hyper as fill_in_hyper
from tests.test_fill_in import point
from tests.test_pairwise import run_dummy_pair_experiment

BASE = "SmolLM2-135M-Instruct"


def hyper(**overrides):
    return fill_in_hyper(**({"interaction_protocol": "fill_in_choice"} | overrides))


def test_candidates_are_scored_per_token_at_their_mean_length():
    # -1 a token over 20 tokens against -2 a token over 4: summed, the short one wins; per
    # token at the mean length (12), the long one by 12 nats
    scores = candidate_scores([(-20.0, 20), (-8.0, 4)])
    assert scores.tolist() == pytest.approx([-12.0, -24.0])
    p = choice_probabilities(scores, 1.0)
    assert p[0] == pytest.approx(1 / (1 + np.exp(-12.0)))
    assert choice_probabilities(scores, 0.0).tolist() == [1.0, 0.0]
    assert choice_probabilities(np.array([0.0, 0.0]), 0.0).tolist() == [1.0, 0.0]  # first of equals
    with pytest.raises(ValueError, match="temperature"):
        choice_probabilities(scores, -1.0)


def test_draws_follow_the_scores_and_repeat_with_the_seed():
    even = [(-10.0, 10), (-10.0, 10)]
    draws = draw_candidates(even, 2000, 1.0, seed=3)
    assert draws == draw_candidates(even, 2000, 1.0, seed=3)
    assert 0.45 < np.mean(draws) < 0.55
    leaning = [(-10.0, 10), (-11.0, 10)]  # one nat apart: p(first) = 1 / (1 + e^-1) = 0.731
    assert np.mean(np.array(draw_candidates(leaning, 4000, 1.0, seed=4)) == 0) == pytest.approx(
        0.731, abs=0.03
    )
    hot = np.mean(np.array(draw_candidates(leaning, 4000, 4.0, seed=4)) == 0)
    assert 0.5 < hot < 0.6  # a higher temperature flattens the choice
    assert set(draw_candidates(leaning, 50, 0.0, seed=5)) == {0}


@pytest.mark.parametrize(
    "bad", [None, "one", ["only"], ["a", ""], ["a", 3], ["a"] * 17, ["a", "a"]]
)
def test_malformed_candidates_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="candidates"):
        check_candidates(bad)


def test_the_server_answers_with_candidates_only(tmp_path: Path):
    """Over real HTTP, through the client the rollouts use, on the dummy engine's scores."""
    chat = [{"role": "user", "content": "Write the missing line."}]
    candidates = ("x = 1", "x = 2 + y")
    with running_server(["--engine", "dummy"], tmp_path / "state") as server:
        client = DirectHttpChatClient(f"{server.url}/v1", None)
        sampling = SamplingParams(temperature=1.0, seed=1, candidates=candidates)
        texts = asyncio.run(client.complete(chat, BASE, 64, sampling))
        assert len(texts) == 64 and set(texts) == set(candidates)
        assert asyncio.run(client.complete(chat, BASE, 64, sampling)) == texts  # seeded
        conversations = [[*chat, {"role": "assistant", "content": c}] for c in candidates]
        reply = httpx.post(
            f"{server.url}/v1/chat/score", json={"model": BASE, "conversations": conversations}
        ).json()
        scores = [(d["logprob"], d["tokens"]) for d in reply["data"]]
        assert texts == [candidates[i] for i in draw_candidates(scores, 64, 1.0, 1)]
        body = {"model": BASE, "messages": chat, "candidates": ["x = 1"]}
        bad = httpx.post(f"{server.url}/v1/chat/completions", json=body)
        assert bad.status_code == 400 and "candidates" in bad.json()["error"]["message"]


def test_only_a_draw_among_candidates_may_be_hotter_than_two(tmp_path: Path):
    """A closed-set draw is a softmax over the candidates' scores: the server takes it up to
    temperature 100 (a hot draw nearly even between versions 3 nats apart), while a decoded
    reply keeps the OpenAI API's 0-2 and is refused above it, by name."""
    chat = [{"role": "user", "content": "Write the missing line."}]
    candidates = ("x = 1", "x = 2 + y")
    with running_server(["--engine", "dummy"], tmp_path / "state") as server:
        client = DirectHttpChatClient(f"{server.url}/v1", None)
        conversations = [[*chat, {"role": "assistant", "content": c}] for c in candidates]
        reply = httpx.post(
            f"{server.url}/v1/chat/score", json={"model": BASE, "conversations": conversations}
        ).json()
        scores = [(d["logprob"], d["tokens"]) for d in reply["data"]]
        hot = SamplingParams(temperature=50.0, seed=2, candidates=candidates)
        texts = asyncio.run(client.complete(chat, BASE, 64, hot))
        assert texts == [candidates[i] for i in draw_candidates(scores, 64, 50.0, 2)]
        for temperature, status in ((2.5, 400), (100.5, 400)):
            body = {"model": BASE, "messages": chat, "temperature": temperature}
            refused = httpx.post(f"{server.url}/v1/chat/completions", json=body)
            assert refused.status_code == status
            assert refused.json()["error"]["param"] == "temperature"
        too_hot = {"model": BASE, "messages": chat, "temperature": 100.5}
        too_hot["candidates"] = list(candidates)
        assert httpx.post(f"{server.url}/v1/chat/completions", json=too_hot).status_code == 400
    leaning = [(-10.0, 10), (-13.0, 10)]
    assert np.mean(np.array(draw_candidates(leaning, 4000, 50.0, seed=6)) == 1) > 0.45


def test_a_hot_rollout_temperature_is_for_closed_replies_only():
    """pure_text_malt.rollout_temperature above 2 is taken where the verifier's reply is drawn
    from the two versions and refused, naming the protocol, where it is decoded."""
    closed = hyper(pure_text_malt={"rollout_temperature": 8.0})
    assert closed.draws_closed_replies and closed.pure_text_malt.rollout_temperature == 8.0
    with pytest.raises(ValueError, match="rollout_temperature=8.0 is above 2.0.*'fill_in' decodes"):
        fill_in_hyper(pure_text_malt={"rollout_temperature": 8.0})
    with pytest.raises(ValueError, match="rollout_temperature: must be in \\[0.0, 100.0\\]"):
        hyper(pure_text_malt={"rollout_temperature": 101.0})
    assert not fill_in_hyper(pure_text_malt={"rollout_temperature": 2.0}).draws_closed_replies


def test_the_choosing_verifier_is_offered_the_two_versions_of_the_missing_part():
    protocol = make_protocol(hyper())
    for correct_first in (True, False):
        datapoint = point(correct_first)
        candidates = reply_candidates(protocol, "verifier", datapoint)
        assert candidates == (
            verdict_reply(protocol, datapoint, ACCEPT),
            verdict_reply(protocol, datapoint, REJECT),
        )
    with pytest.raises(ValueError, match="datapoint"):
        reply_candidates(protocol, "verifier", None)
    free = make_protocol(fill_in_hyper())
    assert reply_candidates(free, "verifier", point(True)) is None  # a free writing
    # both orders show one prompt: the choice cannot follow the order
    params = hyper().agents["_default"]
    prompts = [chat_messages(protocol, "verifier", params, point(c), [], 0, 0) for c in (1, 0)]
    assert prompts[0] == prompts[1]


def test_a_drawn_reply_is_a_verdict_in_both_orders():
    protocol = make_protocol(hyper())
    params = hyper().agents["_default"]
    for correct_first in (True, False):
        datapoint = point(correct_first)
        chat = chat_messages(protocol, "verifier", params, datapoint, [], 0, 0)
        responses = asyncio.run(
            generate_responses(
                DummyChatClient(seed=2, invalid_probability=0.5),
                protocol,
                "verifier",
                params,
                "m",
                chat,
                40,
                0,
                0,
                9,
                datapoint=datapoint,
            )
        )
        assert all(r.failure is None for r in responses)  # a version always parses
        by_text = {r.raw: r.decision for r in responses}
        assert by_text == {
            verdict_reply(protocol, datapoint, ACCEPT): ACCEPT,
            verdict_reply(protocol, datapoint, REJECT): REJECT,
        }


def test_a_provider_that_ignores_the_candidates_is_named():
    protocol = make_protocol(hyper())
    params = hyper().agents["_default"]

    class Ignoring(DummyChatClient):
        def reply(self, messages, sampling, index):
            return "```python\nreturn xs[n - 1]  # my own\n```"

    chat = chat_messages(protocol, "verifier", params, point(True), [], 0, 0)
    with pytest.raises(RuntimeError, match="ignores `candidates`"):
        asyncio.run(
            generate_responses(
                Ignoring(),
                protocol,
                "verifier",
                params,
                "m",
                chat,
                2,
                0,
                0,
                9,
                datapoint=point(True),
            )
        )


def test_free_replies_keep_their_call_keys_and_requests():
    chat = [{"role": "user", "content": "hi"}]
    free = SamplingParams(temperature=1.0, seed=3)
    assert "candidates" not in request_body(chat, "m", 2, free, 3)
    # the keys of calls journaled before candidates existed still match
    import hashlib
    import json

    old = {
        "temperature": 1.0,
        "top_p": None,
        "max_tokens": None,
        "seed": 3,
        "repetition_penalty": None,
    }
    blob = json.dumps({"messages": chat, "model": "m", "n": 2, "sampling": old}, sort_keys=True)
    assert request_digest(chat, "m", 2, free) == hashlib.sha256(blob.encode()).hexdigest()
    chosen = SamplingParams(temperature=1.0, seed=3, candidates=("a", "b"))
    assert request_body(chat, "m", 2, chosen, 3)["candidates"] == ["a", "b"]
    assert call_key(chat, "m", 2, chosen) != call_key(chat, "m", 2, free)
    with pytest.raises(ValueError, match="distinct"):
        SamplingParams(candidates=("a", "a"))


def test_a_fill_in_choice_experiment_runs_on_the_dummy_backend(prefect_harness, tmp_path: Path):
    folder = run_dummy_pair_experiment("fill_in_choice", tmp_path)
    malt = pd.read_parquet(folder / "experiment.parquet").query("arm == 'malt'")
    assert malt["y"].mean() == 0.5 and len(malt) == 68
    assert malt["decided"].all()  # every drawn reply is a version, so a verdict
    iteration = folder / "seeds/11/arms/malt/iterations/0000"
    rows = pd.read_parquet(iteration / "datasets/dpo/verifier.parquet")
    nodes = pd.read_parquet(iteration / "nodes.parquet")
    assert len(rows) and not rows["guess_replaced"].any()  # sampled pairs only
    assert set(rows["chosen_node_id"]) | set(rows["rejected_node_id"]) <= set(nodes["node_id"])
    # every row contrasts the two versions of one missing part
    for chosen, rejected in zip(rows["chosen"], rows["rejected"], strict=True):
        assert list(chosen[:-1]) == list(rejected[:-1])
        assert chosen[-1]["content"].startswith("```python\n") and chosen[-1] != rejected[-1]
