"""Stage: summary statistics of the iteration, stored in `manifest.json` under "stats"."""

from __future__ import annotations

from prefect import task

from nip_core.malt.iteration_stats import iteration_stats
from nip_core.run.artifacts import RunPaths, load_manifest, read_parquet, save_manifest
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import NODES_FILE, PAIRS_FILE, REWARDS_FILE
from nip_core.run.stages import run_stage


def summarise_iteration(paths: RunPaths, context: IterationContext) -> dict:
    it = context.iteration

    def compute():
        read = lambda name: read_parquet(paths.fs, paths.iteration_file(it, name))  # noqa: E731
        pairs = None if context.is_ei_iteration else read(PAIRS_FILE)
        stats = iteration_stats(read(NODES_FILE), read(REWARDS_FILE), pairs, context.agent_names)
        return {}, stats

    stats = run_stage(paths, context, "summary", compute)["info"]
    manifest = load_manifest(paths, it, context.run_name, context.hyper_params.config_hash())
    if manifest.get("stats") != stats:
        manifest["stats"] = stats
        save_manifest(paths, it, manifest)
    return stats


@task(name="summarise-iteration")
def summarise_iteration_task(paths: RunPaths, context: IterationContext) -> dict:
    return summarise_iteration(paths, context)
