"""Decision phrases and per-channel splitting of agent replies.

Run: pytest tests/test_parsing.py -q
"""

from __future__ import annotations

import pytest

from nip_core.agents import InvalidResponse, ParsedResponse, parse_decision, parse_response
from nip_core.agents.parsing import looks_like_decision_attempt, split_by_headers
from nip_core.episode import ACCEPT, REJECT
from tests.agent_fixtures import build_protocol

DECISIONS = [
    # plain labels
    ("Decision: accept", "accept"),
    ("Decision: reject", "reject"),
    ("decision: ACCEPT", "accept"),
    ("DECISION: REJECT!", "reject"),
    ("Decision:accept", "accept"),
    ("Decision: rejected", "reject"),
    ("Decision = Accepted", "accept"),
    ("Decision - accept", "accept"),
    ("Decision — reject", "reject"),
    ("Verdict: reject", "reject"),
    # markdown
    ("**Decision:** `Accept`", "accept"),
    ("**Decision: Reject**", "reject"),
    ("> Decision: reject", "reject"),
    ('Decision: "accept"', "accept"),
    ("## Decision\nAccept", "accept"),
    ("Decision:\n\nreject", "reject"),
    ("__Final Decision__: *accept*", "accept"),
    # labels inside longer text
    ("My decision: REJECT.", "reject"),
    ("Final decision: accept", "accept"),
    ("My final decision is: accept", "accept"),
    ("After reviewing the code, my decision is to reject it.", "reject"),
    ("The loop is off by one, so the output is wrong.\n\nDecision: reject", "reject"),
    ("Decision: Accept the solution", "accept"),
    ("I cannot accept this solution. Decision: reject", "reject"),
    # first-person statements
    ("I accept the solution.", "accept"),
    ("I reject the solution.", "reject"),
    ("I will accept this solution because it handles all the cases.", "accept"),
    ("I have decided to reject the code.", "reject"),
    ("I'm going to reject this.", "reject"),
    ("Based on the answers, I therefore accept.", "accept"),
    ("The answer convinces me; I accept.", "accept"),
    ("We accept the code.", "accept"),
    # bare verdicts
    ("Accept", "accept"),
    ("**REJECT**", "reject"),
    ("Reject.\n", "reject"),
    # neither
    ("Question for Expert: what is your decision?", None),
    ("Question for Expert: Should I accept the solution if n = 0?", None),
    ("Question for Expert: Why would I reject this code?", None),
    ("Question for Expert_1: Is the decision: accept justified", None),
    ("The expert says the code is fine. Would you accept it?", None),
    ("I do not accept the solution.", None),
    ("I would accept the solution if it handled n = 0.", None),
    ("Decision: I am not sure yet.", None),
    ("I'd like to ask another question.", None),
    ("Answer: the verifier should accept the solution because it is right.", None),
    ("", None),
    # both
    ("Decision: accept. Decision: reject.", None),
    ("I accept the solution. Actually, I reject it.", None),
    ("Decision: accept/reject", None),
    ("Decision: Accept or Reject", None),
]


@pytest.mark.parametrize("text, expected", DECISIONS)
def test_parse_decision(text: str, expected: str | None) -> None:
    assert parse_decision(text) == expected


@pytest.mark.parametrize(
    "text, attempt",
    [
        ("Decision: maybe", True),
        ("Decision: I am not sure yet.", True),
        ("Decision: accept. Decision: reject.", True),
        ("Question for Expert: what is your decision?", False),
        ("Question for Expert: how does line 2 handle n = 0?", False),
    ],
)
def test_decision_attempts(text: str, attempt: bool) -> None:
    assert looks_like_decision_attempt(text) == attempt


NIP = build_protocol("nip", rounds=5)
DEBATE = build_protocol("debate")


def test_verifier_decides_without_messages() -> None:
    parsed = parse_response(NIP, "verifier", 2, 0, "**Decision:** Reject")
    assert parsed == ParsedResponse(messages={}, decision=REJECT)
    assert parse_response(DEBATE, "verifier", 0, 0, "Decision: accept").decision == ACCEPT


def test_verifier_question_is_a_message() -> None:
    text = "Question for Expert: what happens when n = 10?"
    assert parse_response(NIP, "verifier", 0, 0, f"  {text}\n") == ParsedResponse({"main": text})


def test_ambiguous_verifier_text_is_invalid() -> None:
    with pytest.raises(InvalidResponse, match="no single verdict") as info:
        parse_response(NIP, "verifier", 0, 0, "Decision: accept or reject, hard to say")
    assert "Decision: accept" in info.value.reason


def test_verifier_cannot_decide_before_min_rounds() -> None:
    protocol = build_protocol("nip", rounds=5)
    late = type(protocol)(**{**protocol.__dict__, "min_message_rounds": 3})
    parsed = parse_response(late, "verifier", 0, 0, "Decision: accept")
    assert parsed.decision is None and parsed.messages == {"main": "Decision: accept"}


def test_an_early_verdict_is_a_move_where_it_ends_the_episode() -> None:
    """With `early_decision_ends_episode` the verifier's early verdict is returned as a decision
    (`step_outcome` then ends the episode undecided); a question stays a message, and a prover
    quoting a verdict still only speaks."""
    protocol = build_protocol("nip", rounds=5, early_decision_ends_episode=True)
    late = type(protocol)(**{**protocol.__dict__, "min_message_rounds": 3})
    assert parse_response(late, "verifier", 0, 0, "Decision: reject").decision == REJECT
    asked = parse_response(late, "verifier", 0, 0, "Question for Expert: why?")
    assert asked.decision is None and asked.messages == {"main": "Question for Expert: why?"}
    quoted = parse_response(late, "prover", 1, 0, "Answer: Decision: accept")
    assert quoted.decision is None


def test_prover_quoting_decision_keeps_message() -> None:
    text = 'Answer: you should write "Decision: accept" now.'
    parsed = parse_response(NIP, "prover", 1, 0, text)
    assert parsed == ParsedResponse(messages={"main": text}, decision=None)


@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_empty_text_is_invalid(text: str) -> None:
    for agent, round in (("verifier", 0), ("prover", 1)):
        with pytest.raises(InvalidResponse, match="empty"):
            parse_response(NIP, agent, round, 0, text)


def test_idle_agent_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="does not act in round 1"):
        parse_response(NIP, "verifier", 1, 0, "Question for Expert: hi")


def test_debate_headers_split_in_any_order_and_case() -> None:
    text = "Let me ask.\nquestion for expert_2: why line 3?\n**Question for Expert_1:** why not?"
    parsed = parse_response(DEBATE, "verifier", 0, 0, text)
    assert parsed.messages == {
        "prover1_channel": "question for expert_2: why line 3?\n**",
        "prover0_channel": "Question for Expert_1:** why not?",
    }
    assert parsed.decision is None


def test_debate_missing_header_is_invalid() -> None:
    with pytest.raises(InvalidResponse, match="Question for Expert_2:"):
        parse_response(DEBATE, "verifier", 0, 0, "Question for Expert_1: why?")


def test_debate_prover_single_channel_takes_whole_text() -> None:
    text = "Answer: Question for Expert_2: is irrelevant."
    assert parse_response(DEBATE, "prover0", 1, 0, text).messages == {"prover0_channel": text}


def test_empty_header_part_is_invalid() -> None:
    headers = {"a": "Q1:", "b": "Q2:"}
    with pytest.raises(InvalidResponse, match="after header 'Q1:' is empty"):
        split_by_headers("Q1:   \nQ2: something", headers)
    assert split_by_headers("Q2: y\nQ1: x", headers) == {"b": "Q2: y", "a": "Q1: x"}
