"""What every command shares: its options, the up-front checks, the preamble of its flow
(`open_run`), and how errors end a command.

A command checks everything it can before anything is written or started; a user error
(configuration, run folder, artifacts) ends it with one `error:` line and exit status 2. Other
failures print their traceback as usual. `--debug` shows the traceback of user errors too.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
import openai
import yaml
from pydantic import BaseModel, Field

from flows.lm_server import lm_server_for, served_context
from nip_core.agents.chat_client import EndpointUnreachableError, ModelCallError
from nip_core.agents.preflight import check_providers
from nip_core.lm_server.launch import ServerHandle
from nip_core.parameters import HyperParameters, load_hyper_params
from nip_core.parameters.hyper import InteractionProtocolType, TrainerType
from nip_core.run import provenance
from nip_core.run.artifacts import ArtifactError, RunPaths, default_root
from nip_core.run.iteration_context import IterationContext, build_context
from nip_core.run.lock import RunLockedError, lock_run_folder
from nip_core.run.run_folder import ConfigError, preflight, prepare_run, previous_group_models
from nip_core.run.tracking import Tracker, open_tracker

T = TypeVar("T")
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"
# What a user can fix: each ends a command with one line and exit status 2 (before anything
# runs, any ValueError of the checks counts too).
USER_ERRORS: tuple[type[BaseException], ...] = (ConfigError, ArtifactError, RunLockedError)
ENDPOINT_GONE_EXIT = 3  # a model server stopped answering mid-run (bad input is 2)


class RunSettings(BaseModel):
    """The settings runs most often change, as typed fields (a form in the Prefect UI for a
    deployment); unset fields keep the configuration's value. Anything else: `overrides`."""

    interaction_protocol: InteractionProtocolType | None = None
    trainer: TrainerType | None = None
    seed: int | None = None
    num_iterations: int | None = Field(None, ge=1, description="rl.num_iterations")
    rollouts_per_iteration: int | None = Field(None, ge=1, description="datapoints per iteration")
    num_responses_per_timestep: int | None = Field(None, ge=1, description="K: samples per turn")
    learning_rate: float | None = Field(None, gt=0, description="rl.learning_rate")
    model_name: str | None = Field(None, description="every agent's model")
    use_dummy_api: bool | None = Field(None, description="offline deterministic replies")

    def as_overrides(self) -> list[str]:
        """The set fields as `--set` overrides (applied before the explicit ones)."""
        keys = {
            "num_iterations": "rl.num_iterations",
            "rollouts_per_iteration": "rl.rollouts_per_iteration",
            "learning_rate": "rl.learning_rate",
            "num_responses_per_timestep": "pure_text_malt.num_responses_per_timestep",
            "model_name": "agents._default.model_name",
            "use_dummy_api": "agents._default.use_dummy_api",
        }
        values = self.model_dump(exclude_none=True)
        return [f"{keys.get(name, name)}={_yaml_scalar(v)}" for name, v in values.items()]


def _yaml_scalar(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def all_overrides(settings: RunSettings | None, overrides: list[str] | None) -> list[str]:
    """A flow's typed settings, then its dotted overrides (the later wins)."""
    return [*(settings.as_overrides() if settings else []), *(overrides or [])]


TaskRunnerKind = Literal["thread", "dask", "ray"]


def make_task_runner(kind: TaskRunnerKind, address: str | None = None) -> Any:
    """The Prefect task runner for `--task-runner`: Prefect's thread pool (today's behaviour),
    `prefect-dask` (a local cluster of worker processes, or the scheduler at `address`) or
    `prefect-ray` (a local Ray, or the cluster at `address`). Not part of the config hash."""
    if kind == "thread":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner()
    if kind == "dask":
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError as e:
            raise ConfigError("--task-runner dask needs: pip install -e '.[dask]'") from e
        if address:
            return DaskTaskRunner(address=address)
        return DaskTaskRunner(
            cluster_kwargs={"n_workers": 2, "processes": True, "threads_per_worker": 1}
        )
    if kind == "ray":
        try:
            from prefect_ray import RayTaskRunner
        except ImportError as e:
            raise ConfigError("--task-runner ray needs: pip install -e '.[ray]'") from e
        return RayTaskRunner(address=address) if address else RayTaskRunner()
    raise ConfigError(f"--task-runner must be thread, dask or ray, got {kind!r}")


@dataclass(frozen=True)
class OpenRun:
    """A run folder this process holds (`open_run`), and where its rollout shards run."""

    hp: HyperParameters
    run_name: str
    paths: RunPaths
    task_runner: TaskRunnerKind = "thread"
    task_runner_address: str | None = None
    server: ServerHandle | None = None  # the self-hosted server the run uses, if any

    def context(self, iteration: int) -> IterationContext:
        """The iteration's context, from the models the previous iteration switched to; its
        self-hosted clients go to the run's server."""
        models = previous_group_models(self.paths, iteration)
        context = build_context(self.hp, self.run_name, iteration, models)
        return served_context(context, self.server.url if self.server else None)

    @contextlib.contextmanager
    def tracking(self, use_wandb: bool) -> Iterator[Tracker]:
        """The run's tracker (wandb, or nothing with `use_wandb` false), finished afterwards."""
        tracker = open_tracker(self.paths, self.hp, self.run_name, use_wandb)
        try:
            yield tracker
        finally:
            tracker.finish()


@contextlib.contextmanager
def open_run(
    hp: HyperParameters,
    root: str | None,
    run_name: str,
    *,
    task_runner: TaskRunnerKind = "thread",
    task_runner_address: str | None = None,
    inside: OpenRun | None = None,
    server_url: str | None = None,
    replay_runs: Sequence[str] = (),
) -> Iterator[OpenRun]:
    """What every flow does first: lock the run folder (one writer at a time), check its stored
    configuration and prepare it, start the self-hosted server when the run needs one and
    nothing answers on its port, and `freeze_long_lived_objects`; undone in reverse afterwards
    (the server stops only if this started it). `root` None: `$NIP_ARTIFACTS_ROOT` or
    ./artifacts. `inside`: the open run this one runs within (an experiment's arm within its
    seed's base run), whose server it uses; `server_url`: where to find or start the server
    instead of the configured address (a seed in a worker process of its own); `replay_runs`:
    run folders whose rollout calls this run replays (`RunPaths.replay_runs`)."""
    root = root or default_root()
    outer = inside.server if inside is not None else None
    with lock_run_folder(RunPaths.open(root, run_name)):
        paths = dataclasses.replace(prepare_run(hp, root, run_name), replay_runs=tuple(replay_runs))
        invocation = provenance.start_invocation(paths, provenance.collect())
        outcome = "interrupted"
        try:
            first = served_context(build_context(hp, run_name, 0), server_url)
            with lm_server_for(paths, first, outer) as server:
                freeze_long_lived_objects()
                yield OpenRun(hp, run_name, paths, task_runner, task_runner_address, server)
            outcome = "finished"
        finally:
            provenance.end_invocation(paths, invocation, outcome=outcome)


_frozen = False


def freeze_long_lived_objects() -> None:
    """Collect once, then `gc.freeze` what is alive (imports, Prefect's engine, settings): once
    per process.

    A full collection walks every object the process holds; with Prefect, pydantic and the model
    libraries loaded that took ~0.2 s on 2 cores, and it blocked the event loop of whatever
    stage it fell into (the rollout stage's first requests left that much later in
    `bench/rollout_http.py --via cli`). Frozen objects are still freed by reference counting;
    later full collections walk only what the run allocates (~3 ms).
    """
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True


def resolve_hyper_params(config: str | None, overrides: list[str] | None) -> HyperParameters:
    """The configuration file (default: `configs/default.yaml`) with the `--set` overrides."""
    path = Path(config) if config else DEFAULT_CONFIG
    try:
        return load_hyper_params(path, list(overrides or []))
    except (ValueError, KeyError, TypeError, OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: {_one_line(e)}") from e


def _one_line(error: BaseException) -> str:
    """A parser's multi-line message (YAML marks the spot over several lines) as one line."""
    return " ".join(str(error).split())


def run_folder_arguments(
    prog: str,
    description: str,
    *,
    config_help: str = f"YAML or JSON hyper-parameters (default: {DEFAULT_CONFIG})",
    set_help: str = "dotted override, repeatable, e.g. --set agents.verifier.temperature=0.7",
    run_name: str = "default",
    run_name_help: str = "folder under the artifacts root",
) -> argparse.ArgumentParser:
    """The options of every command that writes a run folder: configuration, overrides, run
    name, artifacts root, wandb and --debug."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help=config_help)
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=set_help
    )
    parser.add_argument("--run-name", default=run_name, help=run_name_help)
    parser.add_argument(
        "--artifacts-root",
        default=None,
        help="root folder or fsspec URL (default: $NIP_ARTIFACTS_ROOT or ./artifacts)",
    )
    parser.add_argument(
        "--no-wandb",
        dest="use_wandb",
        action="store_false",
        help="do not track with wandb (default: offline wandb run under <run folder>/wandb, "
        "or $WANDB_DIR when set)",
    )
    parser.add_argument(
        "--task-runner",
        choices=["thread", "dask", "ray"],
        default="thread",
        help="where rollout shards run: this process (default), a Dask or a Ray cluster",
    )
    parser.add_argument(
        "--task-runner-address",
        default=None,
        help="join an existing cluster (Dask scheduler or Ray address) instead of a local one",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks of configuration and input errors"
    )
    return parser


def add_iteration_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--iteration", type=int, default=0, help=help_text)


def checked_run_arguments(args: argparse.Namespace) -> tuple[HyperParameters, str, RunPaths]:
    """What every run command checks before writing anything: (hyper-parameters, root, paths).

    Raises ConfigError or ValueError: a bad configuration, a negative iteration, a bad run
    name, a run folder holding another configuration, an artifacts root that cannot be
    written, a dataset that cannot be read.
    """
    hp = resolve_hyper_params(args.config, args.overrides)
    check_run_providers(hp)
    if getattr(args, "iteration", 0) < 0:
        raise ConfigError(f"--iteration must be >= 0, got {args.iteration}")
    root = args.artifacts_root or default_root()
    return hp, root, preflight(hp, root, args.run_name)


def check_run_providers(hp: HyperParameters) -> None:
    """Every agent's provider can serve the run (key, endpoint, fine-tuning where trained);
    PreflightError, a ValueError, before anything is written."""
    context = build_context(hp, "preflight", 0)
    trained = set(context.agent_names) - set(context.frozen_agents)
    check_providers(context.agent_params, trained)


def run_command(args: argparse.Namespace, check: Callable[[], T], run: Callable[[T], int]) -> int:
    """`run(check())`'s exit status; a user error becomes one `error:` line and status 2."""
    try:
        checked = check()
    except (*USER_ERRORS, ValueError) as e:
        return _user_error(args, e)
    try:
        return run(checked)
    except USER_ERRORS as e:
        return _user_error(args, e)
    except Exception as e:
        url = unreachable_endpoint(e)
        if url is None or getattr(args, "debug", False):
            raise
        print(
            f"error: the model server at {url} stopped answering ({_one_line(e)[:300]}); "
            "start it again (or fix its address) and rerun the same command: finished work "
            "is kept",
            file=sys.stderr,
        )
        return ENDPOINT_GONE_EXIT


def unreachable_endpoint(error: BaseException) -> str | None:
    """The endpoint (scheme://host:port) behind a failure that is a server not answering at all
    (connection refused or reset, after every retry), searched along the error's causes; None
    for any other failure."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        url = _unreachable_url(current)
        if url is not None:
            return url
        pending += [current.__cause__, current.__context__]
        if isinstance(current, BaseExceptionGroup):
            pending += list(current.exceptions)
    return None


def _unreachable_url(error: BaseException) -> str | None:
    if isinstance(error, ModelCallError):
        return error.unreachable_url
    if isinstance(error, EndpointUnreachableError):
        return error.url
    if isinstance(error, openai.APIConnectionError | httpx.TransportError):
        try:
            url = error.request.url  # httpx raises RuntimeError when no request is attached
        except (AttributeError, RuntimeError):
            return None
        return f"{url.scheme}://{url.host}:{url.port}" if url.port else f"{url.scheme}://{url.host}"
    return None


def _user_error(args: argparse.Namespace, error: BaseException) -> int:
    if getattr(args, "debug", False):
        raise error
    print(f"error: {error}", file=sys.stderr)
    return 2
