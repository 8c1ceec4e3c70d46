"""System prompts and the chats built from episode history.

Run: pytest tests/test_prompts.py -q
"""

from __future__ import annotations

import jinja2
import pytest

from nip_core.agents import chat_messages, system_prompt, training_conversation
from nip_core.agents.prompts import supervisor_fires
from nip_core.data.pairwise import shows_pairs, writes_disputed_part
from nip_core.episode import ACCEPT, REJECT
from nip_core.protocols import PROTOCOL_NAMES, channel_order
from tests.agent_fixtures import (
    QUESTION,
    SOLUTION,
    build_protocol,
    debate_episode,
    make_datapoint,
    make_params,
    nip_episode,
    turn,
)

PARAMS = make_params()


@pytest.mark.parametrize("name", PROTOCOL_NAMES)
@pytest.mark.parametrize("randomise", [False, True])
def test_every_prompt_renders_with_verbatim_code(name: str, randomise: bool) -> None:
    protocol = build_protocol(name, randomize_prover_stance=randomise)
    datapoint = make_datapoint(pair=shows_pairs(name))
    for agent in protocol.agent_names:
        text = system_prompt(protocol, agent, PARAMS, datapoint, episode_seed=3)
        if writes_disputed_part(name):  # the solution with its disputed first line cut out
            assert f"```python\n# <the missing part>\n{SOLUTION.split(chr(10), 1)[1]}\n```" in text
        else:
            assert f"```python\n{SOLUTION}\n```" in text
        assert QUESTION in text
        assert "&lt;" not in text and "&amp;" not in text and "&#34;" not in text
        if agent != "verifier":
            assert "150 words" in text


def test_verifier_prompt_states_question_budget() -> None:
    protocol = build_protocol("nip", rounds=7)  # verifier rounds 0,2,4,6 -> 3 questions
    text = system_prompt(protocol, "verifier", PARAMS, make_datapoint(), 0)
    assert "at most 3 questions" in text
    assert '"Question for Expert:"' in text


@pytest.mark.parametrize("stance, word", [(0, "reject"), (1, "accept")])
def test_randomised_prover_argues_datapoint_stance(stance: int, word: str) -> None:
    protocol = build_protocol("nip", randomize_prover_stance=True)
    text = system_prompt(protocol, "prover", PARAMS, make_datapoint(prover_stance=stance), 0)
    assert f"get Verifier to {word} the solution" in text


def test_fixed_stance_ignores_datapoint_stance() -> None:
    protocol = build_protocol("nip", randomize_prover_stance=False)
    text = system_prompt(protocol, "prover", PARAMS, make_datapoint(prover_stance=0), 0)
    assert "get Verifier to accept the solution" in text


@pytest.mark.parametrize("name", ["nip", "adp", "mnip"])
def test_randomised_verifier_prompt_hides_stance(name: str) -> None:
    protocol = build_protocol(name, randomize_prover_stance=True)
    prompts = {
        stance: system_prompt(protocol, "verifier", PARAMS, make_datapoint(prover_stance=stance), 0)
        for stance in (0, 1)
    }
    assert prompts[0] == prompts[1]
    assert "not told which" in prompts[0]
    assert "accept the solution, whatever" not in prompts[0]
    fixed = system_prompt(build_protocol(name), "verifier", PARAMS, make_datapoint(), 0)
    assert "not told which" not in fixed


def test_mnip_provers_share_randomised_stance() -> None:
    protocol = build_protocol("mnip", randomize_prover_stance=True)
    for agent in ("prover0", "prover1"):
        text = system_prompt(protocol, agent, PARAMS, make_datapoint(prover_stance=0), 0)
        assert "to reject the solution" in text


def test_debate_prompts_name_sides_and_headers() -> None:
    protocol = build_protocol("debate")
    verifier = system_prompt(protocol, "verifier", PARAMS, make_datapoint(), 0)
    assert "Expert_1 argues that the solution should be rejected" in verifier
    assert "Question for Expert_1: <your question>\nQuestion for Expert_2:" in verifier
    prover0 = system_prompt(protocol, "prover0", PARAMS, make_datapoint(), 0)
    assert "to reject the solution" in prover0 and "Expert_2's arguments" in prover0


def test_custom_template_absolute_and_relative(tmp_path, monkeypatch) -> None:
    template = tmp_path / "mine.j2"
    template.write_text("{{ human_name }} must {{ agent_stance_string }}: {{ solution }}")
    protocol = build_protocol("nip")
    for path in (str(template), "mine.j2"):
        monkeypatch.chdir(tmp_path)
        params = make_params(system_prompt_template_path=path)
        text = system_prompt(protocol, "prover", params, make_datapoint(), 0)
        assert text == f"Expert must accept: {SOLUTION}"


def test_custom_template_errors_are_clear(tmp_path) -> None:
    protocol = build_protocol("nip")
    missing = make_params(system_prompt_template_path=str(tmp_path / "absent.j2"))
    with pytest.raises(FileNotFoundError, match="absent.j2"):
        system_prompt(protocol, "prover", missing, make_datapoint(), 0)
    bad = tmp_path / "bad.j2"
    bad.write_text("{{ no_such_variable }}")
    with pytest.raises(jinja2.UndefinedError, match="no_such_variable"):
        system_prompt(
            protocol,
            "prover",
            make_params(system_prompt_template_path=str(bad)),
            make_datapoint(),
            0,
        )


def test_nip_verifier_chat_from_history() -> None:
    protocol = build_protocol("nip", rounds=5)  # verifier's last round is 4
    chat = chat_messages(protocol, "verifier", PARAMS, make_datapoint(), nip_episode(), 4, 0)
    assert chat[0]["role"] == "system" and SOLUTION in chat[0]["content"]
    assert chat[1:5] == [
        {"role": "assistant", "content": "Question for Expert: q0"},
        {"role": "user", "content": "Answer: a1", "name": "Expert"},
        {"role": "assistant", "content": "Question for Expert: q2"},
        {"role": "user", "content": "Answer: a3", "name": "Expert"},
    ]
    assert chat[5] == {"role": "system", "content": protocol.agent("verifier").last_round_message}
    assert len(chat) == 6


def test_last_round_note_only_at_last_active_round() -> None:
    protocol = build_protocol("nip", rounds=6)  # verifier rounds 0, 2, 4: the note comes at 4
    chat = chat_messages(protocol, "verifier", PARAMS, make_datapoint(), nip_episode(), 4, 0)
    assert chat[-1]["role"] == "system" and chat[-1] is not chat[0]
    early = chat_messages(protocol, "verifier", PARAMS, make_datapoint(), nip_episode()[:2], 2, 0)
    assert [m["role"] for m in early] == ["system", "assistant", "user"]


def test_nip_prover_chat_from_history() -> None:
    protocol = build_protocol("nip", rounds=5)
    chat = chat_messages(protocol, "prover", PARAMS, make_datapoint(), nip_episode()[:3], 3, 0)
    assert chat[1:] == [
        {"role": "user", "content": "Question for Expert: q0", "name": "Verifier"},
        {"role": "assistant", "content": "Answer: a1"},
        {"role": "user", "content": "Question for Expert: q2", "name": "Verifier"},
    ]


def test_debate_prover_sees_opponent_before_itself() -> None:
    protocol = build_protocol("debate")
    chat = chat_messages(protocol, "prover0", PARAMS, make_datapoint(), debate_episode(), 2, 0)
    assert chat[1:] == [
        {"role": "user", "content": "Question for Expert_2: x2", "name": "Verifier"},
        {"role": "user", "content": "Question for Expert_1: x1", "name": "Verifier"},
        {"role": "assistant", "content": "Answer: p0"},
        {"role": "user", "content": "Answer: p1", "name": "Expert_2"},
    ]


def test_mnip_prover_sees_only_its_channel() -> None:
    protocol = build_protocol("mnip")
    chat = chat_messages(protocol, "prover1", PARAMS, make_datapoint(), debate_episode(), 2, 0)
    assert [m["content"] for m in chat[1:]] == ["Question for Expert_2: x2", "Answer: p1"]


def test_debate_verifier_channel_order_follows_seed() -> None:
    protocol = build_protocol("debate")
    assert protocol.randomize_channel_order
    senders = {"prover0_channel": "Expert_1", "prover1_channel": "Expert_2"}
    orders = set()
    for seed in range(12):
        chat = chat_messages(
            protocol, "verifier", PARAMS, make_datapoint(), debate_episode(), 2, seed
        )
        expected = [senders[c] for c in channel_order(protocol, "verifier", 1, seed)]
        assert [m["name"] for m in chat[2:]] == expected
        orders.add(tuple(expected))
    assert len(orders) == 2


def test_anonymous_sender_has_no_name() -> None:
    protocol = build_protocol("merlin_arthur")
    seed = 4  # even seed: prover0 speaks in round 0
    turns = [turn(0, {"prover0": "Look at line 2."}, {"main": ("prover0", "Look at line 2.")})]
    chat = chat_messages(protocol, "verifier", PARAMS, make_datapoint(), turns, 1, seed)
    assert chat[-1] == {"role": "user", "content": "Look at line 2."}


@pytest.mark.parametrize(
    "mode, first, later",
    [
        ("none", False, False),
        ("all", True, True),
        ("first", True, False),
        ("all_but_first", False, True),
    ],
)
def test_supervisor_modes(mode: str, first: bool, later: bool) -> None:
    protocol = build_protocol("nip", rounds=5)
    params = make_params(use_supervisor_message=mode, supervisor_name="Boss")
    episode = nip_episode()
    for round, expected in ((0, first), (2, later)):
        chat = chat_messages(
            protocol, "verifier", params, make_datapoint(), episode[:round], round, 0
        )
        has = chat[-1].get("name") == "Boss"
        assert has == expected, (mode, round)
        if has:
            assert chat[-1]["role"] == "user" and "question round" in chat[-1]["content"]
    # A prover's first turn is round 1, not round 0.
    chat = chat_messages(protocol, "prover", params, make_datapoint(), episode[:1], 1, 0)
    assert (chat[-1].get("name") == "Boss") == first


def test_supervisor_texts_follow_the_game_state() -> None:
    protocol = build_protocol("nip", rounds=5)
    params = make_params(use_supervisor_message="all")
    episode = nip_episode()
    last = chat_messages(protocol, "verifier", params, make_datapoint(), episode, 4, 0)[-1]
    assert "must now decide" in last["content"] and "Decision: reject" in last["content"]
    prover = chat_messages(protocol, "prover", params, make_datapoint(), episode[:1], 1, 0)[-1]
    assert 'Answer Verifier\'s latest question, starting with "Answer: "' in prover["content"]
    with pytest.raises(ValueError, match="use_supervisor_message"):
        supervisor_fires("sometimes", True)


def test_the_verifier_is_told_when_an_early_verdict_ends_the_conversation() -> None:
    params = make_params(use_supervisor_message="all")
    texts = []
    for ends in (False, True):
        protocol = build_protocol("nip", rounds=5, early_decision_ends_episode=ends)
        protocol = type(protocol)(**{**protocol.__dict__, "min_message_rounds": 3})
        first = chat_messages(protocol, "verifier", params, make_datapoint(), [], 0, 0)[-1]
        texts.append(first["content"])
    assert "cannot give a verdict yet" in texts[0] and "ends the conversation" not in texts[0]
    assert "a verdict now ends the conversation with none" in texts[1]


def test_turns_must_match_round() -> None:
    protocol = build_protocol("nip", rounds=5)
    with pytest.raises(ValueError, match="round 3 needs the 3 earlier"):
        chat_messages(protocol, "prover", PARAMS, make_datapoint(), nip_episode()[:2], 3, 0)
    shuffled = [nip_episode()[1], nip_episode()[0]]
    with pytest.raises(ValueError, match="in order"):
        chat_messages(protocol, "prover", PARAMS, make_datapoint(), shuffled, 2, 0)


def test_training_conversation_ends_with_own_last_output() -> None:
    protocol = build_protocol("nip", rounds=5)
    episode = nip_episode()
    convo = training_conversation(protocol, "verifier", PARAMS, make_datapoint(), episode, 0)
    assert convo[-1] == {"role": "assistant", "content": "Question for Expert: q2"}
    assert convo == chat_messages(
        protocol, "verifier", PARAMS, make_datapoint(), episode[:2], 2, 0
    ) + [convo[-1]]
    prover = training_conversation(protocol, "prover", PARAMS, make_datapoint(), episode, 0)
    assert prover[-1] == {"role": "assistant", "content": "Answer: a3"} and len(prover) == 5


def test_training_conversation_none_when_silent() -> None:
    protocol = build_protocol("merlin_arthur")
    turns = [turn(0, {"prover0": "msg"}, {"main": ("prover0", "msg")})]
    assert training_conversation(protocol, "prover1", PARAMS, make_datapoint(), turns, 0) is None
    with pytest.raises(ValueError, match="no agent 'ghost'"):
        training_conversation(protocol, "ghost", PARAMS, make_datapoint(), turns, 0)


@pytest.mark.parametrize(
    "guess, text", [(ACCEPT, "Decision: accept"), (REJECT, "Decision: reject")]
)
def test_guess_replacement(guess: int, text: str) -> None:
    protocol = build_protocol("nip", rounds=5)
    episode = nip_episode()
    convo = training_conversation(
        protocol,
        "verifier",
        PARAMS,
        make_datapoint(),
        episode,
        0,
        replace_verifier_decision_with=guess,
    )
    assert convo[-1] == {"role": "assistant", "content": text}
    assert (
        convo[:-1]
        == training_conversation(protocol, "verifier", PARAMS, make_datapoint(), episode, 0)[:-1]
    )
    with pytest.raises(ValueError, match="only the verifier"):
        training_conversation(
            protocol,
            "prover",
            PARAMS,
            make_datapoint(),
            episode,
            0,
            replace_verifier_decision_with=guess,
        )


def test_a_pair_protocol_refuses_a_datapoint_without_its_second_solution() -> None:
    for name in ("pairwise", "fill_in"):
        with pytest.raises(ValueError, match="no second solution"):
            system_prompt(build_protocol(name), "verifier", PARAMS, make_datapoint(), 0)
