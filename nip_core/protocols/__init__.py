"""The interaction protocols: nip's six (nip, adp, debate, merlin_arthur, mnip, solo_verifier)
and our two pair verifiers: pairwise (two solutions to one question: which is correct?) and
fill-in (the solution with the part where the two differ cut out: the verifier writes it).

A protocol is a frozen `Protocol` record built by `make_protocol(hyper_params)`; everything it
does is a pure function of (protocol, round, episode seed, decision):

    protocol = make_protocol(hyper_params)
    for round in range(protocol.max_message_rounds):
        speakers = active_agents(protocol, round, seed)
        ...  # generate messages, parse the verifier's decision
        outcome = step_outcome(protocol, round, decision, y, prover_stance, seed)
        if outcome.ended:
            break

Deliberate differences from the reference (see /work/shared/reference/README.md):
- MNIP provers are rewarded when the verdict equals their own stance (as their prompts say).
- With `shared_reward`, prover reward ranges and mid-points are the verifier's.
- `max_verifier_questions` counts the verifier's rounds, so sequential schedules get it right.
- The verifier's prompt channel order is seeded by a stable hash of (episode seed, round).
- The solo verifier has one round instead of two.
"""

from nip_core.protocols.build import PROTOCOL_NAMES, make_protocol
from nip_core.protocols.records import AgentSpec, Protocol, StepOutcome
from nip_core.protocols.rewards import (
    agent_stance,
    reward_mid_point,
    reward_range,
    step_outcome,
)
from nip_core.protocols.schedule import (
    active_agents,
    active_channels,
    channel_order,
    is_agent_active,
    last_active_round,
    max_rounds_remaining_questions,
    stable_hash,
    verifier_can_decide,
    verifier_rounds,
)

__all__ = [
    "PROTOCOL_NAMES",
    "AgentSpec",
    "Protocol",
    "StepOutcome",
    "active_agents",
    "active_channels",
    "agent_stance",
    "channel_order",
    "is_agent_active",
    "last_active_round",
    "make_protocol",
    "max_rounds_remaining_questions",
    "reward_mid_point",
    "reward_range",
    "stable_hash",
    "step_outcome",
    "verifier_can_decide",
    "verifier_rounds",
]
