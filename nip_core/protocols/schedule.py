"""Who speaks when: per-round activity, decision opportunities and prompt channel order.

All functions are pure and depend only on the protocol, the round and the episode seed, so a
rollout replayed with the same seed takes the same turns in any process.
"""

from __future__ import annotations

from nip_core.protocols.records import MAIN_CHANNEL, Protocol
from nip_core.seeding import stable_int

_PROVER_CHANNELS = {"prover0": "prover0_channel", "prover1": "prover1_channel"}


def _check_round(protocol: Protocol, round: int) -> None:
    if not 0 <= round < protocol.max_message_rounds:
        raise ValueError(
            f"round {round} is outside protocol {protocol.name!r}'s rounds "
            f"0..{protocol.max_message_rounds - 1}"
        )


def _two_prover_turn(protocol: Protocol, round: int) -> tuple[str, ...]:
    """The agents taking round `round` in debate and MNIP (four schedule variants)."""
    first, second = ("prover0", "prover1") if protocol.prover0_first else ("prover1", "prover0")
    if protocol.sequential:
        order = (
            ("verifier", first, second) if protocol.verifier_first else (first, second, "verifier")
        )
        return (order[round % 3],)
    provers = ("prover0", "prover1")
    verifier_turn = (round % 2 == 0) == protocol.verifier_first
    return ("verifier",) if verifier_turn else provers


def _channels_for(
    protocol: Protocol, agent_name: str, round: int, episode_seed: int
) -> tuple[str, ...]:
    """The schedule rule itself, without validation of its inputs."""
    is_verifier = agent_name == protocol.verifier_name
    match protocol.name:
        case "nip" | "adp":
            verifier_turn = (round % 2 == 0) == protocol.verifier_first
            return (MAIN_CHANNEL,) if verifier_turn == is_verifier else ()
        case "debate" | "mnip":
            if agent_name not in _two_prover_turn(protocol, round):
                return ()
            return protocol.channels if is_verifier else (_PROVER_CHANNELS[agent_name],)
        case "merlin_arthur":
            if round == 1:
                return (MAIN_CHANNEL,) if is_verifier else ()
            chosen = "prover0" if episode_seed % 2 == 0 else "prover1"
            return (MAIN_CHANNEL,) if agent_name == chosen else ()
        case "solo_verifier" | "pairwise" | "fill_in" | "fill_in_choice":
            return (MAIN_CHANNEL,) if round == 0 else ()
    raise ValueError(f"unknown protocol {protocol.name!r}")


def active_channels(
    protocol: Protocol, agent_name: str, round: int, episode_seed: int
) -> tuple[str, ...]:
    """Channels `agent_name` writes to in `round`; empty when the agent is idle.

    A give-up ("empty") message for an agent should fill exactly these channels, never all of
    them, so that it cannot collide with another agent's message on a shared channel.
    """
    protocol.agent(agent_name)
    _check_round(protocol, round)
    return _channels_for(protocol, agent_name, round, episode_seed)


def is_agent_active(protocol: Protocol, agent_name: str, round: int, episode_seed: int) -> bool:
    """Whether `agent_name` sends any message in `round`."""
    return bool(active_channels(protocol, agent_name, round, episode_seed))


def active_agents(protocol: Protocol, round: int, episode_seed: int) -> tuple[str, ...]:
    """Agents that act in `round`, in agent order."""
    return tuple(
        name
        for name in protocol.agent_names
        if is_agent_active(protocol, name, round, episode_seed)
    )


def verifier_rounds(protocol: Protocol) -> tuple[int, ...]:
    """Rounds in which the verifier acts (it never depends on the episode seed)."""
    verifier = protocol.verifier_name
    rounds = range(protocol.max_message_rounds)
    return tuple(r for r in rounds if is_agent_active(protocol, verifier, r, 0))


def count_verifier_rounds(protocol: Protocol) -> int:
    """How many times the verifier acts in a full episode; used as `max_verifier_questions`.

    Counting the schedule (rather than ceil/floor of R/2) also covers sequential schedules, which
    have one verifier round in three.
    """
    return len(verifier_rounds(protocol))


def last_active_round(protocol: Protocol, agent_name: str, episode_seed: int) -> int | None:
    """The agent's final round, where its `last_round_message` belongs; None if it never acts.

    With verifier-first NIP and even R the verifier's final round is R-2, not R-1, so prompt code
    should use this rather than R-1 to tell the verifier it must decide now.
    """
    rounds = range(protocol.max_message_rounds - 1, -1, -1)
    return next((r for r in rounds if is_agent_active(protocol, agent_name, r, episode_seed)), None)


def verifier_can_decide(protocol: Protocol, round: int, episode_seed: int) -> bool:
    """A decision counts only in a verifier round no earlier than `min_message_rounds - 1`."""
    active = is_agent_active(protocol, protocol.verifier_name, round, episode_seed)
    return active and round >= protocol.min_message_rounds - 1


def max_rounds_remaining_questions(protocol: Protocol, round: int) -> int:
    """Questions the verifier may still ask from `round` on, keeping its last turn for a verdict."""
    _check_round(protocol, round)
    remaining = sum(1 for r in verifier_rounds(protocol) if r >= round)
    return max(0, remaining - 1)


def stable_hash(*parts: object) -> int:
    """A 64-bit hash of the parts' text that is the same in every process (unlike `hash`)."""
    return stable_int(*parts, bits=64)


def channel_order(
    protocol: Protocol, agent_name: str, round: int, episode_seed: int
) -> tuple[str, ...]:
    """Order in which the agent's visible channels appear in its prompt for `round`.

    A debate/MNIP verifier sees the two experts in a per-round order drawn from
    (episode seed, round) when `randomize_channel_order` is set, so it cannot learn a position
    bias; a debate prover sees its opponent's channel before its own.
    """
    spec = protocol.agent(agent_name)
    _check_round(protocol, round)
    visible = spec.visible_channels
    if protocol.name not in ("debate", "mnip"):
        return visible
    if spec.is_verifier:
        if not protocol.randomize_channel_order:
            return visible
        return tuple(sorted(visible, key=lambda c: stable_hash(episode_seed, round, c)))
    own = _PROVER_CHANNELS[agent_name]
    return tuple(c for c in visible if c != own) + (own,)


def validate_schedule(protocol: Protocol) -> None:
    """Reject schedules where an agent writes to a channel it cannot see, or two agents share one.

    Merlin-Arthur depends on the seed only through its parity, so seeds 0 and 1 cover every case.
    """
    for episode_seed in (0, 1):
        for round in range(protocol.max_message_rounds):
            senders: dict[str, str] = {}
            for spec in protocol.agents:
                for channel in _channels_for(protocol, spec.name, round, episode_seed):
                    if channel not in spec.visible_channels:
                        raise ValueError(
                            f"{protocol.name}: agent {spec.name!r} would write to channel "
                            f"{channel!r} in round {round}, but cannot see it"
                        )
                    if channel in senders:
                        raise ValueError(
                            f"{protocol.name}: agents {senders[channel]!r} and {spec.name!r} "
                            f"both write to channel {channel!r} in round {round}"
                        )
                    senders[channel] = spec.name
