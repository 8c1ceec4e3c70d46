"""Per-step rewards, reward ranges and mid-points for every protocol.

Rewards are non-zero only when the verifier decides or the episode runs out of rounds, apart from
`verifier_no_guess_reward` in verifier rounds without a decision (0 by default).
"""

from __future__ import annotations

from nip_core.episode import ACCEPT, REJECT
from nip_core.protocols.records import Protocol, StepOutcome
from nip_core.protocols.schedule import is_agent_active, verifier_can_decide

_BINARY = (REJECT, ACCEPT)


def _check_binary(name: str, value: int) -> None:
    if value not in _BINARY:
        raise ValueError(f"{name} must be {REJECT} (reject) or {ACCEPT} (accept), got {value!r}")


def agent_stance(protocol: Protocol, agent_name: str, prover_stance: int) -> int:
    """The verdict a prover argues for in this episode (1 accept, 0 reject).

    The datapoint's `prover_stance` is used only when the protocol allows it and
    `randomize_prover_stance` is on; otherwise the agent's default stance applies.
    """
    spec = protocol.agent(agent_name)
    if spec.is_verifier:
        raise ValueError(f"agent {agent_name!r} is the verifier, which argues no stance")
    _check_binary("prover_stance", prover_stance)
    if protocol.stance_randomisable and protocol.randomize_prover_stance:
        return prover_stance
    return spec.default_stance


def _forced(protocol: Protocol, decision: int | None, y: int) -> int | None:
    """Apply `force_guess`, which replaces whatever the verifier said (or did not say)."""
    match protocol.force_guess:
        case "zero":
            return REJECT
        case "one":
            return ACCEPT
        case "y":
            return y
    return decision


def _verifier_step_reward(
    protocol: Protocol, decision: int | None, y: int, verifier_active: bool, terminated: bool
) -> float:
    if decision is not None:
        return protocol.verifier_reward if decision == y else protocol.verifier_incorrect_penalty
    if terminated:
        return protocol.verifier_terminated_penalty
    return protocol.verifier_no_guess_reward if verifier_active else 0.0


def _prover_step_reward(
    protocol: Protocol, name: str, decision: int | None, prover_stance: int, shared: float
) -> float:
    if protocol.shared_reward:
        return shared
    if decision is not None and decision == agent_stance(protocol, name, prover_stance):
        return protocol.prover_reward
    return 0.0


def step_outcome(
    protocol: Protocol,
    round: int,
    decision: int | None,
    y: int,
    prover_stance: int,
    episode_seed: int,
) -> StepOutcome:
    """Settle one round: did the verifier decide, is the episode over, and who earns what.

    Args:
        protocol: the protocol being played.
        round: 0-based round number.
        decision: the verifier's verdict this round (1 accept, 0 reject) or None. It is replaced by
            `force_guess` if set, and ignored when the verifier cannot decide in this round
            (not its turn, or before `min_message_rounds - 1`).
        y: 1 if the solution is correct, else 0.
        prover_stance: the datapoint's stance, used only when stances are randomised.
        episode_seed: the episode seed (Merlin-Arthur picks its prover by its parity).

    Returns:
        A `StepOutcome` with a reward for every agent. `terminated` is set when no decision was
        made in the episode's last possible round (R-1; for the solo verifier, round 0), and
        with `early_decision_ends_episode` when the verifier gave a verdict before it may.
    """
    _check_binary("y", y)
    _check_binary("prover_stance", prover_stance)
    if decision is not None:
        _check_binary("decision", decision)
    can_decide = verifier_can_decide(protocol, round, episode_seed)
    verifier_active = is_agent_active(protocol, protocol.verifier_name, round, episode_seed)
    early = protocol.early_decision_ends_episode and decision is not None
    early &= verifier_active and not can_decide
    decision = _forced(protocol, decision, y)
    if not can_decide:
        decision = None
    decided = decision is not None
    terminated = early or (not decided and round >= protocol.max_message_rounds - 1)
    verifier_reward = _verifier_step_reward(protocol, decision, y, verifier_active, terminated)
    rewards = {protocol.verifier_name: verifier_reward}
    for name in protocol.prover_names:
        rewards[name] = _prover_step_reward(
            protocol, name, decision, prover_stance, verifier_reward
        )
    ordered = {name: rewards[name] for name in protocol.agent_names}
    return StepOutcome(decided=decided, done=decided, terminated=terminated, rewards=ordered)


def reward_range(protocol: Protocol, agent_name: str) -> tuple[float, float]:
    """(min, max) of an agent's episode reward, for the `interval` pair-selection method.

    Verifier: from the worse of the incorrect and terminated penalties up to `verifier_reward`.
    Provers: 0 to `prover_reward`, or the verifier's range when rewards are shared. The no-guess
    reward is left out, as in our decisions list; it is 0 by default.
    """
    spec = protocol.agent(agent_name)
    if spec.is_verifier or protocol.shared_reward:
        low = min(protocol.verifier_incorrect_penalty, protocol.verifier_terminated_penalty)
        return (low, protocol.verifier_reward)
    return (0.0, protocol.prover_reward)


def reward_mid_point(protocol: Protocol, agent_name: str) -> float:
    """Threshold between a "good" and a "bad" expected reward, for positive/negative pairs.

    Verifier: halfway between a correct and an incorrect verdict; provers: half `prover_reward`.
    With `shared_reward` provers earn the verifier's reward, so they use the verifier's mid-point
    (the reference keeps 0.5 there, which marks almost every prover outcome as bad).
    """
    spec = protocol.agent(agent_name)
    if spec.is_verifier or protocol.shared_reward:
        return (protocol.verifier_reward + protocol.verifier_incorrect_penalty) / 2
    return protocol.prover_reward / 2
