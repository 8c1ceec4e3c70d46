"""What each agent is shown: its system prompt and the chat built from the episode so far.

Templates are Jinja2 files under `templates/<protocol>/<agent>.j2` (falling back to
`<protocol>/prover.j2` for provers that share wording). Autoescaping is off because prompts are
plain text that quote code: HTML-escaping `<`, `>` and `&` would change the program the agents
discuss (the reference's Jinja prompts did that). Undefined variables are errors, never blanks.

Deliberate differences from the reference:
- With randomised prover stances the verifier is told the expert argues for a verdict it is not
  told, instead of always "for acceptance" (nip §8.14).
- The "last round" system note is shown at the agent's own last active round
  (`last_active_round`), so a verifier whose final turn is R-2 still sees it (nip §8.15).
- Supervisor mode "first" means the agent's first turn, not round 0, so it also reaches provers
  that speak second.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, Template, TemplateNotFound

from nip_core.data.pairwise import (
    MISSING_PART_MARKER,
    datapoint_disputed_part,
    masked_solution,
    shows_pairs,
    solution_difference,
    version_reply,
    writes_disputed_part,
)
from nip_core.episode import ACCEPT, DECISION_NAMES, REJECT, ChannelMessage, Datapoint, Turn
from nip_core.parameters.agents import PureTextAgentParameters
from nip_core.protocols import (
    Protocol,
    active_channels,
    agent_stance,
    channel_order,
    last_active_round,
    max_rounds_remaining_questions,
    verifier_can_decide,
)

TEMPLATE_DIR = Path(__file__).parent / "templates"
SUPERVISOR_MODES = ("none", "all", "first", "all_but_first")


@lru_cache(maxsize=1)
def _environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(TEMPLATE_DIR),
        auto_reload=False,  # the package's templates: no stat of the file on every render
        autoescape=False,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )


def stance_string(stance: int) -> str:
    """ "accept"/"reject" for a stance value, as the prompts phrase it."""
    if stance not in DECISION_NAMES:
        raise ValueError(f"stance must be {ACCEPT} (accept) or {REJECT} (reject), got {stance!r}")
    return DECISION_NAMES[stance]


def stance_randomised(protocol: Protocol) -> bool:
    """Whether provers argue for the datapoint's stance rather than a fixed one."""
    return protocol.stance_randomisable and protocol.randomize_prover_stance


def _verifier_stance_string(protocol: Protocol, stances: dict[str, str]) -> str:
    """The provers' shared stance when the verifier may be told it; otherwise empty."""
    values = set(stances.values())
    if stance_randomised(protocol) or len(values) != 1:
        return ""
    return values.pop()


def response_headers(protocol: Protocol, agent_name: str) -> list[str]:
    """Headers the agent starts each channel's part with, in its visible-channel order.

    A single-channel verifier has no required header; it is still given the conventional
    "Question for <expert>:" form so prompts and supervisor notes can name it.
    """
    spec = protocol.agent(agent_name)
    if spec.response_headers:
        return [
            spec.response_headers[c] for c in spec.visible_channels if c in spec.response_headers
        ]
    provers = [protocol.agent(name) for name in protocol.prover_names]
    if spec.is_verifier and provers and not provers[0].anonymous:
        return [f"Question for {provers[0].human_name}:"]
    return []


def prompt_variables(
    protocol: Protocol,
    agent_name: str,
    agent_params: PureTextAgentParameters,
    datapoint: Datapoint,
    episode_seed: int,
) -> dict[str, Any]:
    """Every variable a system-prompt template may use (also for custom templates)."""
    spec = protocol.agent(agent_name)
    if shows_pairs(protocol.name) and datapoint.other_solution is None:
        raise ValueError(
            f"datapoint {datapoint.id} has no second solution, which the {protocol.name!r} "
            "protocol shows; its batch or split lost the pair's other_solution"
        )
    provers = [protocol.agent(name) for name in protocol.prover_names]
    stances = {
        p.human_name: stance_string(agent_stance(protocol, p.name, datapoint.prover_stance))
        for p in provers
    }
    others = [p.human_name for p in provers if p.name != agent_name]
    if spec.is_verifier:
        own_stance = _verifier_stance_string(protocol, stances)
    else:
        own_stance = stances[spec.human_name]
    return {
        "question": datapoint.question,
        "solution": datapoint.solution,
        "other_solution": datapoint.other_solution or "",  # checked above where a pair is shown
        "solution_difference": (
            solution_difference(datapoint.solution, datapoint.other_solution)
            if datapoint.other_solution is not None
            else ""
        ),
        "masked_solution": (
            masked_solution(datapoint.solution, datapoint.other_solution)
            if datapoint.other_solution is not None
            and datapoint.other_solution != datapoint.solution
            else ""
        ),
        "missing_part_marker": MISSING_PART_MARKER,
        "max_response_words": agent_params.max_response_words,
        "max_questions": max(0, protocol.max_verifier_questions - 1),
        "num_rounds": protocol.max_message_rounds,
        "agent_name": agent_name,
        "human_name": spec.human_name,
        "verifier_name": protocol.agent(protocol.verifier_name).human_name,
        "expert_names": [p.human_name for p in provers],
        "expert_name": provers[0].human_name if provers else "",
        "opponent_name": others[0] if len(provers) == 2 and not spec.is_verifier else "",
        "expert_stances": stances,
        "agent_stance_string": own_stance,
        "stance_randomised": stance_randomised(protocol),
        "headers": response_headers(protocol, agent_name),
        "episode_seed": episode_seed,
    }


def _default_template(protocol: Protocol, agent_name: str) -> Template:
    env = _environment()
    names = [f"{protocol.name}/{agent_name}.j2"]
    if not protocol.agent(agent_name).is_verifier:
        names.append(f"{protocol.name}/prover.j2")
    try:
        return env.select_template(names)
    except TemplateNotFound as error:
        raise FileNotFoundError(
            f"no system prompt template for agent {agent_name!r} of protocol {protocol.name!r}; "
            f"looked for {names} under {TEMPLATE_DIR}"
        ) from error


def _custom_template(path_text: str) -> Template:
    """A user template: absolute, or relative to the current directory."""
    path = Path(path_text).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.is_file():
        raise FileNotFoundError(
            f"system_prompt_template_path {path_text!r} does not name a file (resolved to {path})"
        )
    return _environment().from_string(path.read_text(encoding="utf-8"))


def system_prompt(
    protocol: Protocol,
    agent_name: str,
    agent_params: PureTextAgentParameters,
    datapoint: Datapoint,
    episode_seed: int,
) -> str:
    """The rendered system prompt: the agent's role, the problem, the code and the rules."""
    custom = getattr(agent_params, "system_prompt_template_path", None)
    if not custom:
        return _default_system_prompt(protocol, agent_name, agent_params, datapoint, episode_seed)
    variables = prompt_variables(protocol, agent_name, agent_params, datapoint, episode_seed)
    return _custom_template(custom).render(**variables).strip()


# Every node of a tree asks again for its agent's system prompt: rendering it was ~15 % of the
# rollout stage's CPU at 512 datapoints (bench/rollout_http.py). Its inputs are frozen values
# and the package's templates do not change (a user's template file is read every time).
@lru_cache(maxsize=4096)
def _default_system_prompt(*inputs: Any) -> str:
    """`system_prompt` from the package's template; `inputs` are `system_prompt`'s arguments."""
    protocol, agent_name = inputs[:2]
    return _default_template(protocol, agent_name).render(**prompt_variables(*inputs)).strip()


def supervisor_fires(mode: str, first_turn: bool) -> bool:
    """Whether the supervisor note is added for this turn under `use_supervisor_message`."""
    if mode not in SUPERVISOR_MODES:
        raise ValueError(f"use_supervisor_message must be one of {SUPERVISOR_MODES}, got {mode!r}")
    return {
        "none": False,
        "all": True,
        "first": first_turn,
        "all_but_first": not first_turn,
    }[mode]


def supervisor_message(
    protocol: Protocol,
    agent_name: str,
    agent_params: PureTextAgentParameters,
    datapoint: Datapoint,
    turns: Sequence[Turn],
    round: int,
    episode_seed: int,
) -> str:
    """The supervisor's reminder of what to write now (rendered from `templates/supervisor/`)."""
    spec = protocol.agent(agent_name)
    variables = prompt_variables(protocol, agent_name, agent_params, datapoint, episode_seed)
    rounds = range(protocol.max_message_rounds)
    own_turns = [r for r in rounds if active_channels(protocol, agent_name, r, episode_seed)]
    verifier = protocol.verifier_name
    variables |= {
        "round": round,
        "can_decide": spec.is_verifier and verifier_can_decide(protocol, round, episode_seed),
        "early_verdict_ends": protocol.early_decision_ends_episode,
        "questions_remaining": max_rounds_remaining_questions(protocol, round),
        "single_message": len(own_turns) == 1,
        "verifier_has_spoken": any(turn.raw.get(verifier) for turn in turns),
    }
    name = "supervisor/verifier.j2" if spec.is_verifier else "supervisor/prover.j2"
    return _environment().get_template(name).render(**variables).strip()


def _check_turns(turns: Sequence[Turn], round: int | None = None) -> None:
    """Turns must be rounds 0, 1, ... in order (and exactly the rounds before `round`)."""
    found = [turn.round for turn in turns]
    if found != list(range(len(turns))):
        raise ValueError(f"turns must cover rounds 0..{len(turns) - 1} in order, got {found}")
    if round is not None and len(turns) != round:
        raise ValueError(
            f"generating in round {round} needs the {round} earlier turn(s), got {len(turns)}"
        )


def _incoming(protocol: Protocol, message: ChannelMessage) -> dict[str, str]:
    """Another agent's message as a user turn, named unless its sender is anonymous."""
    sender = protocol.agent(message.agent)
    entry = {"role": "user", "content": message.content}
    if not sender.anonymous:
        entry["name"] = sender.human_name
    return entry


def history_messages(
    protocol: Protocol, agent_name: str, turns: Sequence[Turn], episode_seed: int
) -> list[dict[str, str]]:
    """Past rounds from the agent's side: its own raw outputs and what others sent it."""
    visible = set(protocol.agent(agent_name).visible_channels)
    chat: list[dict[str, str]] = []
    for turn in turns:
        own = turn.raw.get(agent_name)
        if own:
            chat.append({"role": "assistant", "content": own})
        for channel in channel_order(protocol, agent_name, turn.round, episode_seed):
            if channel not in visible:
                continue
            for message in turn.messages:
                if message.channel == channel and message.agent != agent_name:
                    chat.append(_incoming(protocol, message))
    return chat


def chat_messages(
    protocol: Protocol,
    agent_name: str,
    agent_params: PureTextAgentParameters,
    datapoint: Datapoint,
    turns: Sequence[Turn],
    round: int,
    episode_seed: int,
) -> list[dict[str, str]]:
    """The chat the agent completes when it acts in `round`, given rounds 0..round-1."""
    _check_turns(turns, round)
    spec = protocol.agent(agent_name)
    chat = [
        {
            "role": "system",
            "content": system_prompt(protocol, agent_name, agent_params, datapoint, episode_seed),
        }
    ]
    chat += history_messages(protocol, agent_name, turns, episode_seed)
    last_round = last_active_round(protocol, agent_name, episode_seed)
    if spec.last_round_message and round == last_round:
        chat.append({"role": "system", "content": spec.last_round_message})
    first_turn = not any(turn.raw.get(agent_name) for turn in turns)
    if supervisor_fires(agent_params.use_supervisor_message, first_turn):
        content = supervisor_message(
            protocol, agent_name, agent_params, datapoint, turns, round, episode_seed
        )
        chat.append({"role": "user", "content": content, "name": agent_params.supervisor_name})
    return chat


def verdict_text(verdict: int) -> str:
    """The verifier's reply that gives `verdict` and nothing else ("Decision: accept")."""
    return f"Decision: {stance_string(verdict)}"


def verdict_reply(protocol: Protocol, datapoint: Datapoint, verdict: int) -> str:
    """The verifier's reply that gives `verdict` and nothing else, in the protocol's form: the
    written verdict, or in the fill-in protocol the version of the missing part it stands for
    (Solution A's to accept, Solution B's to reject)."""
    if not writes_disputed_part(protocol.name):
        return verdict_text(verdict)
    part = datapoint_disputed_part(datapoint)
    stance_string(verdict)  # a clear error for anything but ACCEPT or REJECT
    return version_reply(part.first if verdict == ACCEPT else part.second)


def training_conversation(
    protocol: Protocol,
    agent_name: str,
    agent_params: PureTextAgentParameters,
    datapoint: Datapoint,
    turns: Sequence[Turn],
    episode_seed: int,
    replace_verifier_decision_with: int | None = None,
) -> list[dict[str, str]] | None:
    """The episode from the agent's side, ending with its own last output (None if it never spoke).

    The context before that output is exactly the chat it was generated from, so fine-tuning sees
    what generation saw. `replace_verifier_decision_with` (ACCEPT/REJECT) swaps the verifier's
    last output for that verdict, e.g. to teach the correct guess on a terminated episode.
    """
    _check_turns(turns)
    spoken = [turn.round for turn in turns if turn.raw.get(agent_name)]
    if not spoken:
        protocol.agent(agent_name)  # unknown names still get a clear error
        return None
    last = spoken[-1]
    chat = chat_messages(
        protocol, agent_name, agent_params, datapoint, turns[:last], last, episode_seed
    )
    content = turns[last].raw[agent_name]
    if replace_verifier_decision_with is not None:
        if not protocol.agent(agent_name).is_verifier:
            raise ValueError(f"only the verifier's decision can be replaced, not {agent_name!r}")
        content = verdict_reply(protocol, datapoint, replace_verifier_decision_with)
    return chat + [{"role": "assistant", "content": content}]
