"""The fill-in protocol: the verifier writes the part where a question's two solutions differ."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from nip_core.agents import chat_messages
from nip_core.agents.parsing import InvalidResponse, parse_response
from nip_core.agents.prompts import training_conversation, verdict_reply
from nip_core.data.pairwise import (
    MISSING_PART_MARKER,
    NOTHING_HERE,
    disputed_part,
    masked_solution,
    nearer_version,
    written_code,
)
from nip_core.episode import ACCEPT, REJECT, Datapoint, Turn
from nip_core.model_api.dummy_player import FILL_IN_MARKER, dummy_reply
from nip_core.parameters import HyperParameters
from nip_core.protocols import active_agents, make_protocol, step_outcome
from tests.test_pairwise import hyper as pairwise_hyper
from tests.test_pairwise import one_pair_in_both_orders, run_dummy_pair_experiment

GOOD = "def last(xs):\n    n = len(xs)\n    return xs[n - 1]\n"
BAD = "def last(xs):\n    n = len(xs)\n    return xs[n]\n"


def hyper(**overrides) -> HyperParameters:
    return pairwise_hyper(**({"interaction_protocol": "fill_in"} | overrides))


def point(correct_first: bool) -> Datapoint:
    first, second = (GOOD, BAD) if correct_first else (BAD, GOOD)
    return Datapoint(7, "Return the last item.", first, int(correct_first), 1, second)


def test_the_disputed_part_spans_every_change():
    part = disputed_part(GOOD, BAD)
    assert part == (
        ["def last(xs):", "    n = len(xs)"],
        ["    return xs[n - 1]"],
        ["    return xs[n]"],
        [],
    )
    # a deleted line is the whole part: no shared neighbour joins it, the other side is empty
    part = disputed_part("a = 1\nb = 2\nc = 3", "a = 1\nc = 3")
    assert part == (["a = 1"], ["b = 2"], [], ["c = 3"])
    assert disputed_part("a = 1\nc = 3", "a = 1\nb = 2\nc = 3") == (
        ["a = 1"],
        [],
        ["b = 2"],
        ["c = 3"],
    )
    # two changes make one span from the first to the last
    part = disputed_part("x\ny = 1\nz\nw = 1\nv", "x\ny = 2\nz\nw = 2\nv")
    assert part.first == ["y = 1", "z", "w = 1"] and part.second == ["y = 2", "z", "w = 2"]
    with pytest.raises(ValueError, match="the same"):
        disputed_part(GOOD, GOOD)


def test_the_masked_solution_shows_neither_version_and_marks_the_gap():
    masked = masked_solution(GOOD, BAD)
    assert masked == masked_solution(BAD, GOOD)  # the same whichever solution comes first
    assert masked == f"def last(xs):\n    n = len(xs)\n    {MISSING_PART_MARKER}"
    assert "xs[n" not in masked
    assert FILL_IN_MARKER == MISSING_PART_MARKER  # the dummy recognises the prompt by it


DELETING = "def f(xs):\n    if not xs:\n        return 0\n    return xs[0]\n"
DELETED = "def f(xs):\n    return xs[0]\n"  # the guard deleted: its twin has nothing there


@pytest.mark.parametrize("correct_first", [True, False])
def test_a_deleted_part_is_written_as_nothing_in_both_orders(correct_first: bool):
    first, second = (DELETING, DELETED) if correct_first else (DELETED, DELETING)
    masked = masked_solution(first, second)
    # the marker stands where the deleted lines were, indented as they are, in either order
    assert masked == f"def f(xs):\n    {MISSING_PART_MARKER}\n    return xs[0]"
    datapoint = Datapoint(3, "First item or 0.", first, int(correct_first), 1, second)
    protocol = make_protocol(hyper(interaction_protocol="fill_in_choice"))
    guard = "```python\n    if not xs:\n        return 0\n```"
    nothing = f"```python\n{NOTHING_HERE}\n```"
    accept, reject = (verdict_reply(protocol, datapoint, v) for v in (ACCEPT, REJECT))
    assert (accept, reject) == ((guard, nothing) if correct_first else (nothing, guard))
    # writing the guard back is the right verdict; writing nothing is the buggy twin's
    for text, right in ((guard, True), ("```python\n(nothing)\n```", False)):
        parsed = parse_response(protocol, "verifier", 0, 0, text, datapoint)
        assert parsed.decision == (datapoint.y if right else 1 - datapoint.y)


def test_a_writing_counts_for_the_version_it_is_nearer():
    good, bad = "    return xs[n - 1]", "    return xs[n]"
    assert nearer_version("```python\nreturn xs[n - 1]\n```", good, bad) == 1
    assert nearer_version("```python\n        return  xs[n]\n```", good, bad) == 0
    assert nearer_version("return ys[n - 1]", good, bad) == 1  # no fence: the whole text
    assert nearer_version("```python\n```", good, bad) is None  # as near to both
    assert nearer_version("x", "a = 1", "a  =  1") is None  # the versions read the same
    assert written_code("Here:\n```python\nx = 1\n```\nDone.") == "x = 1\n"
    assert written_code("```python\nx = 1") == "x = 1"  # a cut-off reply keeps its code


@pytest.mark.parametrize("correct_first", [True, False])
def test_writing_the_correct_part_earns_the_reward_in_both_orders(correct_first: bool):
    protocol = make_protocol(hyper())
    assert protocol.agent_names == ("verifier",) and protocol.max_message_rounds == 1
    assert active_agents(protocol, 0, 3) == ("verifier",)
    datapoint = point(correct_first)
    right = parse_response(
        protocol, "verifier", 0, 3, "```python\nreturn xs[n - 1]\n```", datapoint
    )
    wrong = parse_response(protocol, "verifier", 0, 3, "```python\nreturn xs[n]\n```", datapoint)
    assert right.decision == (ACCEPT if correct_first else REJECT) and not right.messages
    assert wrong.decision == (REJECT if correct_first else ACCEPT)
    rewarded = step_outcome(protocol, 0, right.decision, datapoint.y, 1, 3)
    penalised = step_outcome(protocol, 0, wrong.decision, datapoint.y, 1, 3)
    assert rewarded.done and rewarded.rewards["verifier"] > penalised.rewards["verifier"]
    with pytest.raises(InvalidResponse, match="as near"):
        parse_response(protocol, "verifier", 0, 3, "```python\n```", datapoint)


def test_a_fill_in_verdict_needs_the_two_solutions():
    protocol = make_protocol(hyper())
    with pytest.raises(ValueError, match="two solutions"):
        parse_response(protocol, "verifier", 0, 3, "return xs[n]")


def test_both_orders_of_a_pair_show_the_verifier_the_same_prompt():
    protocol, params, first, swapped = one_pair_in_both_orders(hyper())
    prompts = [chat_messages(protocol, "verifier", params, p, [], 0, 0) for p in (first, swapped)]
    assert prompts[0] == prompts[1]  # no order to be biased by
    text = prompts[0][0]["content"]
    part = disputed_part(first.solution, first.other_solution)
    assert masked_solution(first.solution, first.other_solution) in text
    assert MISSING_PART_MARKER in text and "Decision" not in text
    assert "\n".join(part.first) not in text.split("```python")[1]


def test_the_verdict_reply_is_the_version_it_stands_for():
    protocol = make_protocol(hyper())
    for correct_first in (True, False):
        datapoint = point(correct_first)
        accept = verdict_reply(protocol, datapoint, ACCEPT)
        reject = verdict_reply(protocol, datapoint, REJECT)
        assert {accept, reject} == {
            "```python\n    return xs[n - 1]\n```",
            "```python\n    return xs[n]\n```",
        }
        for verdict, reply in ((ACCEPT, accept), (REJECT, reject)):
            parsed = parse_response(protocol, "verifier", 0, 0, reply, datapoint)
            assert parsed.decision == verdict  # a version reply parses back to its verdict
    solo = make_protocol(hyper(interaction_protocol="solo_verifier"))
    assert verdict_reply(solo, point(True), ACCEPT) == "Decision: accept"
    turns = [Turn(0, raw={"verifier": "```python\nreturn 1\n```"}, decision=REJECT)]
    params = hyper().agents["_default"]
    chat = training_conversation(protocol, "verifier", params, point(True), turns, 0, ACCEPT)
    assert chat[-1] == {
        "role": "assistant",
        "content": verdict_reply(protocol, point(True), ACCEPT),
    }


def test_the_dummy_writes_code_for_a_fill_in_prompt():
    hp = hyper()
    protocol = make_protocol(hp)
    chat = chat_messages(protocol, "verifier", hp.agents["_default"], point(True), [], 0, 0)
    replies = [
        dummy_reply(chat, seed=1, request_seed=2, index=i, invalid_probability=0.0)
        for i in range(40)
    ]
    verdicts = {
        parse_response(protocol, "verifier", 0, 0, reply, point(True)).decision for reply in replies
    }
    assert all(reply.startswith("```python\n") for reply in replies)
    assert verdicts == {ACCEPT, REJECT}  # it lands on both sides, so trees hold pairs


def test_a_fill_in_experiment_runs_on_the_dummy_backend(prefect_harness, tmp_path: Path):
    folder = run_dummy_pair_experiment("fill_in", tmp_path)
    malt = pd.read_parquet(folder / "experiment.parquet").query("arm == 'malt'")
    assert malt["y"].mean() == 0.5 and len(malt) == 68  # every test pair, both orders
    assert malt["decided"].mean() > 0.5  # the dummy's writings become verdicts
    # no label written into a training row: every chosen and rejected reply was sampled
    iteration = folder / "seeds/11/arms/malt/iterations/0000"
    rows = pd.read_parquet(iteration / "datasets/dpo/verifier.parquet")
    nodes = pd.read_parquet(iteration / "nodes.parquet")
    assert len(rows) and not rows["guess_replaced"].any()
    assert set(rows["chosen_node_id"]) | set(rows["rejected_node_id"]) <= set(nodes["node_id"])
    assert rows["chosen"].map(lambda c: c[-1]["content"].startswith("```python")).all()


def test_p_accept_compares_the_versions_per_token_where_asked():
    from nip_core.malt.verdict_scores import verdict_table

    episodes = [("leaf", 7, [{"role": "user"}], [{"role": "user"}])]
    scores = [(-20.0, 20), (-8.0, 4)]  # accept: -1 a token, 20 tokens; reject: -2 a token
    summed = verdict_table(episodes, scores).column("p_accept")[0].as_py()
    per_token = verdict_table(episodes, scores, per_token=True).column("p_accept")[0].as_py()
    assert summed < 0.01 and per_token == pytest.approx(1 / (1 + 2.718281828459045**-1))
