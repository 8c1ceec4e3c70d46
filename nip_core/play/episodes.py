"""Chat clients with their call journals, rollout and evaluation settings, and playing a batch.

    clients = chat_clients(context, journal=lambda i: path_of_part(i), fs=paths.fs)
    nodes = asyncio.run(play(items, rollout_settings(context, clients), progress))

One client per distinct endpoint, shared by the agents that use it, so a level of every tree
is in flight against one connection pool; each client journals its finished calls, so a rerun
replays them instead of paying for them twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from nip_core.agents import make_chat_client
from nip_core.agents.call_journal import JournaledClient
from nip_core.agents.clients import close_clients, provider_of
from nip_core.data import datapoints
from nip_core.data.splits import load_split
from nip_core.malt.evaluation import evaluation_items, evaluation_seed, evaluation_size
from nip_core.malt.rollout_tree import BatchItem, RolloutSettings, grow_trees
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import stem_call_journal


def endpoint_key(params: Any) -> tuple:
    """What makes two agents share a client: the same server, provider and timeout."""
    return (
        provider_of(params),  # the dummy API's stand-in differs from the provider it stands for
        params.language_model_server_scheme_host,
        params.language_model_server_port,
        params.request_timeout_seconds,
        tuple(params.model_server_replicas or ()),
    )


def chat_clients(
    context: IterationContext,
    journal: Callable[[int], str] | None = None,
    fs: Any = None,
    earlier: Callable[[int], list[str]] | None = None,
) -> dict[str, object]:
    """Agent -> client, one client per distinct endpoint; with `journal`, endpoint i's client
    journals its calls to `journal(i)` on `fs`, and also replays those of `earlier(i)`."""
    hp = context.hyper_params
    by_endpoint: dict[tuple, object] = {}
    clients = {}
    for agent, params in context.agent_params.items():
        key = endpoint_key(params)
        if key not in by_endpoint:
            client = make_chat_client(
                params, max_concurrency=hp.text_rl.max_concurrent_requests, dummy_seed=hp.seed
            )
            if journal is not None:
                index = len(by_endpoint)
                replayable = earlier(index) if earlier is not None else []
                client = JournaledClient(client, journal(index), fs, replayable)
            by_endpoint[key] = client
        clients[agent] = by_endpoint[key]
    return clients


def journaled_clients(paths: RunPaths, context: IterationContext, stem: str) -> dict:
    """The clients of an evaluation or the switch guard, each journaling to
    `<stem>-calls-<i>.jsonl` in the iteration's folder.

    Their call seeds ignore the iteration, so they also replay the same journal of every earlier
    iteration: a model that an earlier iteration already played on these episodes (a kept or
    frozen model; the guard's previous model, scored as the new one an iteration before) is not
    asked again.
    """

    def journal(endpoint: int) -> str:
        return paths.iteration_file(context.iteration, stem_call_journal(stem, endpoint))

    def earlier(endpoint: int) -> list[str]:
        name = stem_call_journal(stem, endpoint)
        return [paths.iteration_file(i, name) for i in range(context.iteration)]

    return chat_clients(context, journal, paths.fs, earlier)


def replayed_calls(clients: dict[str, object]) -> int:
    """Calls the clients' journals answered instead of the model (each client counted once)."""
    unique = {id(c): c for c in clients.values()}.values()
    return sum(c.replayed for c in unique if isinstance(c, JournaledClient))


def rollout_agent_params(context: IterationContext) -> dict:
    """The agents' settings in training rollouts: their own, at `pure_text_malt.rollout_temperature`
    where that is set (top_p then unset: an agent sets at most one of the two)."""
    temperature = context.hyper_params.pure_text_malt.rollout_temperature
    if temperature is None:
        return context.agent_params
    return {
        name: dataclasses.replace(params, temperature=temperature, top_p=None)
        for name, params in context.agent_params.items()
    }


def rollout_settings(context: IterationContext, clients: dict[str, object]) -> RolloutSettings:
    """Training's settings: K responses per turn, call seeds that change with the iteration."""
    hp = context.hyper_params
    return RolloutSettings(
        protocol=context.protocol,
        agent_params=rollout_agent_params(context),
        models=context.models,
        clients=clients,
        frozen_agents=context.frozen_agents,
        num_responses_per_timestep=context.num_responses_per_timestep,
        frozen_agents_generate_one_response=hp.pure_text_malt.frozen_agents_generate_one_response,
        run_seed=hp.seed,
        iteration=context.iteration,
        max_concurrent_requests=hp.text_rl.max_concurrent_requests,
        early_verdict_retries=hp.pure_text_malt.rollout_early_verdict_retries,
    )


def evaluation_settings(context: IterationContext, clients: dict, split: str) -> RolloutSettings:
    """Training's settings with one response per turn, the agents' own sampling settings, every
    early verdict kept as drawn, and evaluation-specific call seeds.

    Call seeds ignore the iteration (common random numbers): every evaluation of a run asks each
    prompt with the same seed, so a model that did not change answers exactly as before, and
    differences between iterations come from the models alone.
    """
    return dataclasses.replace(
        rollout_settings(context, clients),
        agent_params=context.agent_params,
        num_responses_per_timestep=1,
        run_seed=evaluation_seed(context.hyper_params.seed, split),
        iteration=0,
        early_verdict_retries=0,
    )


def select_items(context: IterationContext, split: str) -> list[BatchItem]:
    """The evaluation's episodes on `split`: a fixed, seeded choice of its datapoints."""
    hp = context.hyper_params
    points = datapoints(load_split(hp, split))
    count = evaluation_size(
        len(points),
        whole_dataset=hp.text_rl.test_on_whole_dataset,
        rollouts_per_iteration=hp.rl.rollouts_per_iteration,
        num_test_iterations=hp.rl.num_test_iterations,
    )
    return evaluation_items(points, count, hp.seed, split)


async def play(items: list[BatchItem], settings: RolloutSettings, progress=None) -> pa.Table:
    """Grow the items' trees to the end, then close the clients (also on failure)."""
    try:
        return await grow_trees(items, settings, progress)
    finally:
        await close_clients(settings.clients.values())
