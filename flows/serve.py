"""Serve the MALT flows as Prefect deployments from this process (no work pool needed).

    prefect server start                                  # in another terminal
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    python -m flows.serve                      # serves malt-iteration, malt-run and experiment
    prefect deployment run 'malt-iteration/malt-iteration' \\
        -p run_name=exp1 -p 'overrides=["agents._default.use_dummy_api=true"]'

Each deployment allows one flow run at a time (further runs wait in the queue), so two runs of
a deployment never write the same run folder; the run-folder lock covers everything else.
"""

from __future__ import annotations

import argparse
import sys

from prefect import serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

from flows.experiment import experiment_flow
from flows.malt_iteration import malt_iteration
from flows.malt_run import malt_run

FLOWS = {"malt-iteration": malt_iteration, "malt-run": malt_run, "experiment": experiment_flow}
# `settings` as an (empty) object, so the UI's run form opens on its typed fields.
DEFAULT_PARAMETERS = {"overrides": [], "run_name": "default", "settings": {}}
FLOW_PARAMETERS = {"experiment": {"overrides": [], "run_name": "experiment", "settings": {}}}


def concurrency_limit() -> ConcurrencyLimitConfig:
    """One run per deployment; a second one waits (ENQUEUE) instead of being cancelled."""
    return ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE)


def deployments(names: list[str] | None = None) -> list:
    """Runner deployments, named like their flows ('malt-iteration/malt-iteration')."""
    chosen = names or list(FLOWS)
    unknown = sorted(set(chosen) - set(FLOWS))
    if unknown:
        raise ValueError(f"unknown deployment(s) {unknown}; choose from {sorted(FLOWS)}")
    return [
        FLOWS[name].to_deployment(
            name=name,
            parameters=dict(FLOW_PARAMETERS.get(name, DEFAULT_PARAMETERS)),
            concurrency_limit=concurrency_limit(),
            tags=["nip-malt"],
            description=(FLOWS[name].description or "").strip().splitlines()[0],
        )
        for name in chosen
    ]


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m flows.serve",
        description="Serve the MALT flows as Prefect deployments (needs PREFECT_API_URL "
        "pointing at a running `prefect server start`).",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(FLOWS),
        help="serve only this deployment (repeatable; default: all)",
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="most flow runs this process runs at once"
    )
    return parser.parse_args(argv)


def warn_if_ephemeral() -> None:
    """Without PREFECT_API_URL the deployments would live in a throw-away server: say so."""
    from prefect.settings import get_current_settings

    if not get_current_settings().api.url:
        print(
            "warning: PREFECT_API_URL is not set; serving against a temporary local API that "
            "the UI of `prefect server start` will not see",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    warn_if_ephemeral()
    serve(*deployments(args.only), limit=args.limit, pause_on_shutdown=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
