"""Stage `summary`: the iteration's statistics, kept in `manifest.json` under "stats"."""

from __future__ import annotations

from nip_core.malt.iteration_stats import iteration_stats
from nip_core.run.artifacts import RunPaths, load_manifest, read_parquet, save_manifest
from nip_core.run.iteration_context import IterationContext
from nip_core.run.stages import run_stage


def summarise_iteration(
    paths: RunPaths, context: IterationContext, nodes: str, rewards: str, pairs: str | None
) -> dict:
    """Run (or reuse) the stage on the `nodes`, `rewards` and `pairs` files (None: an expert
    iteration, which selects no pairs); returns the statistics."""
    it = context.iteration

    def compute():
        read = lambda path: read_parquet(paths.fs, path)  # noqa: E731
        pair_table = None if pairs is None else read(pairs)
        return {}, iteration_stats(read(nodes), read(rewards), pair_table, context.agent_names)

    stats = run_stage(paths, context, "summary", compute)["info"]
    manifest = load_manifest(paths, it, context.run_name, context.hyper_params.config_hash())
    if manifest.get("stats") != stats:
        manifest["stats"] = stats
        save_manifest(paths, it, manifest)
    return stats
