"""`/v1/chat/score`: the log-likelihood of a reply under a served model (the guard's drift check)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from nip_core.agents.message_scores import score_replies, scored_once
from nip_core.lm_server.engines.hf import TransformersEngine
from tests.conftest_lm import running_server
from tests.tiny_model import build_tiny_model

BASE = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Is this code correct?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(["--engine", "dummy"], tmp_path_factory.mktemp("score") / "state") as srv:
        yield srv


def test_score_route_answers_per_conversation_and_rejects_bad_input(server):
    reply = {"role": "assistant", "content": "Decision: accept because it returns x"}
    conversations = [[*CHAT, reply], [*CHAT, {"role": "assistant", "content": "no"}]]
    body = httpx.post(
        f"{server.url}/v1/chat/score", json={"model": BASE, "conversations": conversations}
    ).json()
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert [d["tokens"] for d in body["data"]] == [6, 1]
    assert all(d["logprob"] < 0 for d in body["data"])
    bad = [
        ({"model": BASE, "conversations": [CHAT]}, 400, "end with an assistant"),
        ({"model": BASE, "conversations": []}, 400, "1 to 256"),
        ({"model": "nope", "conversations": conversations}, 404, "not served"),
    ]
    for payload, status, needle in bad:
        answer = httpx.post(f"{server.url}/v1/chat/score", json=payload)
        assert answer.status_code == status and needle in answer.text, answer.text
    params = {
        "model_provider": "SelfHosted",
        "language_model_server_scheme_host": "http://127.0.0.1",
        "language_model_server_port": int(server.url.rsplit(":", 1)[1]),
    }
    scores = score_replies(params, BASE, conversations * 40)  # two distinct chats, sent once
    assert scores == [(d["logprob"], d["tokens"]) for d in body["data"]] * 40
    many = [[*CHAT, {"role": "assistant", "content": "x " * n}] for n in range(300)]
    one_by_one = [score_replies(params, BASE, [chat])[0] for chat in many[::37]]
    scores = score_replies(params, BASE, many + many[::-1])  # 300 distinct: two requests
    assert scores[:300] == scores[300:][::-1] and scores[::37][:9] == one_by_one
    assert score_replies({**params, "model_provider": "OpenAI"}, BASE, conversations) is None
    assert score_replies({**params, "use_dummy_api": True}, BASE, conversations) is None


def test_scored_once_sends_each_distinct_chat_once_and_keeps_the_order():
    chats = [[{"role": "user", "content": c}] for c in "abacba"]
    sent: list[list[list[dict]]] = []

    def score(unique):
        sent.append(unique)
        return [chat[0]["content"].upper() for chat in unique]

    assert scored_once(score, chats) == list("ABACBA")
    assert sent == [[chats[0], chats[1], chats[3]]]
    assert scored_once(lambda unique: None, chats) is None  # a provider that cannot score
    with pytest.raises(ValueError, match="2 scores for 3 distinct chats"):
        scored_once(lambda unique: ["A", "B"], chats)


async def _scores_match_token_by_token(model_dir) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    reply = "Decision: accept, it works"
    start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    ids = tokenizer(prompt + reply, add_special_tokens=False)["input_ids"]
    expected = 0.0
    with torch.inference_mode():  # one prefix at a time: p(token k | tokens before k)
        for k in range(start, len(ids)):
            logits = model(input_ids=torch.tensor([ids[:k]])).logits[0, -1]
            expected += float(torch.log_softmax(logits.float(), -1)[ids[k]])
    engine = TransformersEngine(str(model_dir))
    await engine.start()
    try:
        scored, empty = await engine.score(
            str(model_dir),
            [
                [*CHAT, {"role": "assistant", "content": reply}],
                [*CHAT, {"role": "assistant", "content": ""}],
            ],
        )
        with pytest.raises(ValueError, match="not loaded"):
            await engine.score("no-such-adapter", [[*CHAT, {"role": "assistant", "content": "x"}]])
    finally:
        await engine.stop()
    assert scored[1] == len(ids) - start > 3
    assert scored[0] == pytest.approx(expected, abs=1e-3)
    assert empty == (0.0, 0)


@pytest.mark.slow
def test_transformers_engine_scores_match_token_by_token_logits(tmp_path):
    asyncio.run(_scores_match_token_by_token(build_tiny_model(tmp_path / "tiny")))
