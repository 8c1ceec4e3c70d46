"""How close tree generation gets to "one model latency per round".

    python bench/rollout_concurrency.py

32 datapoints x 3 rounds (NIP) x 2 responses per node, with the dummy backend simulating 200 ms
per call (and no invalid answers, so no re-sampling adds rounds). A concurrent tree generator
needs about rounds x latency; one call at a time would need calls x latency (~150x that).
Prints wall time / (rounds x latency) on the last line (target <= 1.5).
"""

from __future__ import annotations

import asyncio
import time

from nip_core.agents import DummyChatClient
from nip_core.episode import Datapoint
from nip_core.malt.rollout_tree import BatchItem, RolloutSettings, grow_trees
from nip_core.parameters import HyperParameters, apply_overrides
from nip_core.run.iteration_context import build_context
from nip_core.seeding import episode_seed

LATENCY = 0.2
ROUNDS = 3
DATAPOINTS = 32


def main() -> None:
    hp = apply_overrides(
        HyperParameters.construct_test_params(),
        [
            "interaction_protocol=nip",
            f"nip_protocol.max_message_rounds={ROUNDS}",
            "pure_text_malt.num_responses_per_timestep=2",
            "text_rl.max_concurrent_requests=1024",
        ],
    )
    context = build_context(hp, "bench", 0)
    client = DummyChatClient(0, latency=LATENCY, invalid_probability=0.0)
    settings = RolloutSettings(
        protocol=context.protocol,
        agent_params=context.agent_params,
        models=context.models,
        clients={a: client for a in context.agent_names},
        frozen_agents=frozenset(),
        num_responses_per_timestep=2,
        frozen_agents_generate_one_response=True,
        run_seed=hp.seed,
        iteration=0,
        max_concurrent_requests=1024,
    )
    items = [
        BatchItem(
            i,
            Datapoint(i, f"Problem {i}", f"def f():\n    return {i}", i % 2, 1),
            episode_seed(hp.seed, 0, i),
        )
        for i in range(DATAPOINTS)
    ]
    # Warm-up (imports, template compilation) so the timing measures generation only.
    asyncio.run(grow_trees(items[:1], settings))
    client.calls = 0
    start = time.perf_counter()
    nodes = asyncio.run(grow_trees(items, settings))
    wall = time.perf_counter() - start
    print(f"nodes: {nodes.num_rows}, model calls: {client.calls}, wall: {wall:.3f} s")
    print(f"one call at a time would take about {client.calls * LATENCY:.1f} s")
    print(f"ratio wall/(rounds x latency): {wall / (ROUNDS * LATENCY):.3f}")


if __name__ == "__main__":
    main()
