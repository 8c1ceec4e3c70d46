"""Everything an iteration's stages derive from the configuration, computed once.

Pure: from hyper-parameters (and the models the previous iteration switched to) to the protocol,
agent order, reward mid-points, reward ranges, model groups and which agents are frozen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from nip_core.parameters import HyperParameters
from nip_core.protocols import Protocol, make_protocol, reward_mid_point, reward_range


@dataclass(frozen=True)
class IterationContext:
    hyper_params: HyperParameters
    run_name: str
    iteration: int
    protocol: Protocol
    agent_params: Mapping[str, object]
    groups: Mapping[str, tuple[str, ...]]  # group name -> agents, in protocol order
    group_models: Mapping[str, str]  # group name -> model used for generation this iteration

    @property
    def models(self) -> dict[str, str]:
        """Agent -> the model it generates with this iteration: its group's."""
        return {a: self.group_models[g] for g, agents in self.groups.items() for a in agents}

    @property
    def agent_names(self) -> tuple[str, ...]:
        return self.protocol.agent_names

    @property
    def reward_midpoints(self) -> list[float]:
        return [reward_mid_point(self.protocol, a) for a in self.agent_names]

    @property
    def reward_ranges(self) -> list[tuple[float, float]]:
        return [reward_range(self.protocol, a) for a in self.agent_names]

    @property
    def frozen_agents(self) -> frozenset[str]:
        return frozenset(a for a in self.agent_names if self.agent_params[a].freeze_agent)

    @property
    def is_ei_iteration(self) -> bool:
        """Expert iteration (SFT) instead of MALT (DPO) for this iteration."""
        hp = self.hyper_params
        if hp.trainer == "pure_text_ei":
            return True
        return self.iteration < hp.pure_text_malt.num_initial_ei_iterations

    @property
    def num_responses_per_timestep(self) -> int:
        hp = self.hyper_params
        if self.is_ei_iteration:
            return hp.pure_text_ei.num_responses_per_timestep
        return hp.pure_text_malt.num_responses_per_timestep

    @property
    def trainable_groups(self) -> dict[str, tuple[str, ...]]:
        return {
            g: agents
            for g, agents in self.groups.items()
            if not self.agent_params[agents[0]].freeze_agent
        }


def group_agents(
    protocol: Protocol, agent_params: Mapping[str, object]
) -> dict[str, tuple[str, ...]]:
    """Shared model groups: agents with the same `shared_model_group` (default: own name)."""
    groups: dict[str, list[str]] = {}
    for agent in protocol.agent_names:
        group = agent_params[agent].shared_model_group or agent
        if group in protocol.agent_names and group != agent:
            raise ValueError(
                f"agent {agent!r} uses shared_model_group {group!r}, the name of another agent"
            )
        groups.setdefault(group, []).append(agent)
    for group, agents in groups.items():
        for name in (
            "model_name",
            "model_provider",
            "freeze_agent",
            "use_dummy_api",
            "fine_tune_from_scratch",
        ):
            values = {getattr(agent_params[a], name) for a in agents}
            if len(values) > 1:
                raise ValueError(
                    f"agents {agents} share model group {group!r} but differ in {name}: {values}"
                )
    return {g: tuple(a) for g, a in groups.items()}


def build_context(
    hyper_params: HyperParameters,
    run_name: str,
    iteration: int,
    group_models: Mapping[str, str] | None = None,
) -> IterationContext:
    protocol = make_protocol(hyper_params)
    agent_params = {a: hyper_params.agents[a] for a in protocol.agent_names}
    groups = group_agents(protocol, agent_params)
    return IterationContext(
        hyper_params=hyper_params,
        run_name=run_name,
        iteration=iteration,
        protocol=protocol,
        agent_params=agent_params,
        groups=groups,
        group_models=generating_models(groups, agent_params, group_models),
    )


def generating_models(
    groups: Mapping[str, tuple[str, ...]],
    agent_params: Mapping[str, object],
    group_models: Mapping[str, str] | None,
) -> dict[str, str]:
    """Each group's model: the one `group_models` names, else its agents' configured one."""
    return {
        g: (group_models or {}).get(g) or agent_params[a[0]].model_name for g, a in groups.items()
    }


def with_group_models(
    context: IterationContext, group_models: Mapping[str, str]
) -> IterationContext:
    """`context` with its groups generating with `group_models` (the switch guard scores a
    candidate so), everything else, the server its clients use included, kept."""
    current = generating_models(context.groups, context.agent_params, group_models)
    return replace(context, group_models=current)
