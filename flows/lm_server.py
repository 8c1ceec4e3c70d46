"""The run's self-hosted language-model server: its own, found again, shared, or started.

Which agents are self-hosted and on which port is read here from the run's agent settings, the
engine and flags from its `server` section; `nip_core.lm_server.launch` starts the process and
`supervise` restarts it when it dies. The server's state goes under the run folder
(`<run>/lm_server/`), and its `/health` names the run that owns it, so two runs never share one by
accident: a run whose port answers with another run's server starts its own on a free port (and its
context points its clients there, `served_context`); `server.shared` shares one on purpose. A run
opened inside another (an experiment's arm inside its seed's base run) is handed the outer run's
server. A flow stops only a server it started itself (a shared one: never).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import replace
from itertools import islice
from pathlib import Path
from urllib.parse import urlparse

from nip_core.agents.chat_client import EndpointUnreachableError
from nip_core.agents.clients import provider_of, self_hosted_url, served_at
from nip_core.lm_server.launch import (
    ServerHandle,
    default_timeout,
    free_port,
    port_is_free,
    same_folder,
    server_command,
    server_identity,
)
from nip_core.lm_server.supervise import SupervisedServer
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import IterationContext
from nip_core.run.iteration_files import LM_SERVER_DIR

ENGINE_ENV = "NIP_LM_SERVER_ENGINE"  # transformers | vllm | dummy; beats the config key
LOOPBACK = ("127.0.0.1", "localhost", "::1")
log = logging.getLogger(__name__)
SHARED_OWNER = "shared"  # the owner a shared server reports: any run may use it


def self_hosted_agents(context: IterationContext) -> list:
    """The settings of the agents served by our server (the dummy API aside)."""
    return [params for params in context.agent_params.values() if provider_of(params).self_hosted]


def self_hosted_endpoint(context: IterationContext) -> tuple[str, str, int] | None:
    """(scheme://host, host, port) of the server the run needs, or None: the self-hosted agents'
    `self_hosted_url` (they all name the same server: `AgentsParameters` checks)."""
    agents = self_hosted_agents(context)
    if not agents:
        return None
    url = self_hosted_url(agents[0])
    parsed = urlparse(url)
    scheme_host = url.removesuffix(f":{parsed.port}") if parsed.port else url
    return scheme_host, parsed.hostname or "127.0.0.1", parsed.port or 80


def server_engine(context: IterationContext) -> str:
    """The engine to start the server with: NIP_LM_SERVER_ENGINE when set, else
    `server.engine`, else transformers."""
    if os.environ.get(ENGINE_ENV):
        return os.environ[ENGINE_ENV]
    return context.hyper_params.server.engine or "transformers"


def server_options(context: IterationContext, engine: str) -> list[str]:
    """Our server's engine and training flags from the run's `server` section: vLLM's port,
    parallelism, memory share and context length, GPUs per training job; and vLLM's LoRA rank
    limit from the self-hosted agents' ranks."""
    agents = self_hosted_agents(context)
    if not agents:
        return []
    server = context.hyper_params.server
    options = ["--train-processes", str(server.training_num_processes)]
    if server.training_deepspeed_config:
        options += ["--train-deepspeed-config", server.training_deepspeed_config]
    if engine != "vllm":
        return options
    options += [
        "--vllm-port", str(server.vllm_port),
        "--vllm-tensor-parallel-size", str(server.vllm_tensor_parallel_size),
        "--vllm-data-parallel-size", str(server.vllm_data_parallel_size),
        "--vllm-gpu-memory-utilization", str(server.vllm_gpu_memory_utilization),
        "--vllm-max-lora-rank", str(max(p.lora_rank for p in agents)),
    ]  # fmt: skip
    if server.vllm_max_model_len is not None:
        options += ["--vllm-max-model-len", str(server.vllm_max_model_len)]
    if server.vllm_enforce_eager:
        options += ["--vllm-enforce-eager"]
    if server.vllm_serve_during_training:
        options += ["--vllm-serve-during-training"]
    return options


def ensure_lm_server(
    paths: RunPaths, context: IterationContext, timeout: float | None = None
) -> ServerHandle | None:
    """The run's server: None when no agent is self-hosted; a handle without a process for a
    server the run uses but does not stop (a remote one, a shared one, its own left over from a
    killed invocation is stopped by pid); else a supervised server started on this machine, on
    the configured port or, when another run's server holds it, on a free one."""
    endpoint = self_hosted_endpoint(context)
    if endpoint is None:
        return None
    scheme_host, host, port = endpoint
    url = f"{scheme_host}:{port}"
    identity = server_identity(url)
    if host not in LOOPBACK:
        if identity is None:
            raise EndpointUnreachableError(
                url, f"the language-model server at {url} does not answer; start it there"
            )
        return ServerHandle(url, None)
    shared = context.hyper_params.server.shared
    state_dir = _state_dir(paths, port, shared)
    if identity is not None:
        if _usable_by_any_run(identity, shared):
            log.warning(
                "using the server at %s (%s); this run will not stop it", url, _describe(identity)
            )
            return ServerHandle(url, None)
        if same_folder(identity.get("state_dir"), state_dir):
            log.warning("using this run's own server at %s (pid %s)", url, identity.get("pid"))
            return ServerHandle(url, None, pid=identity.get("pid"))
        port = _other_port(port, f"the server at {url} is another run's ({_describe(identity)})")
    elif not port_is_free(host, port):
        port = _other_port(port, f"port {port} is in use by a process that is not our server")
    try:
        return _start(scheme_host, port, context, paths, state_dir, timeout, shared)
    except RuntimeError:
        # Two runs started together may both have found the port free: the loser moves, or,
        # sharing, uses the winner's.
        url = f"{scheme_host}:{port}"
        winner = server_identity(url)
        if winner is None or (same_folder(winner.get("state_dir"), state_dir) and not shared):
            raise
        if _usable_by_any_run(winner, shared):
            log.warning("using the server at %s (%s)", url, _describe(winner))
            return ServerHandle(url, None)
        port = _other_port(port, f"another run's server took port {port} ({_describe(winner)})")
        return _start(scheme_host, port, context, paths, state_dir, timeout, shared)


def _usable_by_any_run(identity: dict, shared: bool) -> bool:
    """Whether a run may use the server `identity` describes without owning it: this run shares
    on purpose, or the server is a shared one or was started by hand (`python -m
    nip_core.lm_server`, no owner)."""
    return shared or identity.get("owner") in (None, SHARED_OWNER)


def _state_dir(paths: RunPaths, port: int, shared: bool) -> Path | None:
    """The run's `<run>/lm_server/`; a shared server's sits beside the run folder."""
    if not paths.is_local:
        return None
    run_dir = Path(paths.run_dir)
    return run_dir.parent / f"lm_server-shared-{port}" if shared else run_dir / LM_SERVER_DIR


def _describe(identity: dict) -> str:
    owner = identity.get("owner") or "none: started outside any run"
    return f"owner {owner}, state {identity.get('state_dir')}"


def _other_port(port: int, why: str) -> int:
    chosen = free_port()
    log.warning(
        "%s; this run starts a server of its own on port %d instead of %d "
        "(server.shared: true shares one)",
        why, chosen, port,
    )  # fmt: skip
    return chosen


def _start(
    scheme_host: str,
    port: int,
    context: IterationContext,
    paths: RunPaths,
    state_dir: Path | None,
    timeout: float | None,
    shared: bool,
) -> ServerHandle:
    engine = server_engine(context)
    options = server_options(context, engine)
    if "--vllm-port" in options:
        at = options.index("--vllm-port") + 1
        options[at] = str(_free_port_pair(int(options[at])))
    owner = SHARED_OWNER if shared else str(paths.run_dir)
    command = server_command(port, engine, options, state_dir, owner)
    url = f"{scheme_host}:{port}"
    state_dir = state_dir or Path(".")
    server = SupervisedServer(
        url,
        command,
        state_dir,
        default_timeout(engine) if timeout is None else timeout,
        max_restarts=0 if shared else context.hyper_params.server.max_restarts,
    )
    server.start()
    if shared:
        log.warning("shared language-model server: %s (state %s), left running", url, state_dir)
        server.detach()
    else:
        log.warning("this run's language-model server: %s (state %s)", url, state_dir)
    return server


def _free_port_pair(preferred: int, host: str = "127.0.0.1") -> int:
    """`preferred` when it and the next port are free (vLLM may use both), else such a pair."""
    candidate = preferred
    for _ in range(50):
        if port_is_free(host, candidate) and port_is_free(host, candidate + 1):
            return candidate
        candidate = free_port(host)
    raise RuntimeError("found no two free ports in a row for vLLM")


@contextlib.contextmanager
def lm_server_for(
    paths: RunPaths, context: IterationContext, outer: ServerHandle | None = None
) -> Iterator[ServerHandle | None]:
    """The run's server for the duration of a block (`ensure_lm_server`; one it started stops
    afterwards). `outer`: the server of the run this one is opened inside, used as it is and
    left to that run."""
    if outer is not None:
        log.warning("using the server of the run this one is opened inside: %s", outer.url)
        yield outer
        return
    server = ensure_lm_server(paths, context)
    try:
        yield server
    finally:
        if server is not None:
            server.stop()


def served_context(context: IterationContext, url: str | None) -> IterationContext:
    """`context` with its self-hosted agents' clients pointed at the server at `url` (None:
    unchanged): the run's server session hands its endpoint to the clients the stages build."""
    if url is None:
        return context
    served = {agent: served_at(params, url) for agent, params in context.agent_params.items()}
    return replace(context, agent_params=served)


def side_by_side_urls(context: IterationContext, count: int) -> list[str | None]:
    """A server URL for each of `count` runs side by side in worker processes, each with a
    server of its own: the configured port and the free ports above it. All None where the
    runs start no server of their own (no self-hosted agent, a remote or shared server): they
    use that one, as a single run does."""
    endpoint = self_hosted_endpoint(context)
    if endpoint is None:
        return [None] * count
    scheme_host, host, port = endpoint
    if host not in LOOPBACK or context.hyper_params.server.shared:
        return [None] * count
    if server_engine(context) == "vllm":
        raise ValueError(
            "seeds side by side need a server each, and vLLM servers would contend for the "
            "same ports and accelerator memory: set experiment.parallel_seeds: 1, or serve "
            "with server.engine: transformers"
        )
    free = list(islice((p for p in range(port, port + 1000) if port_is_free(host, p)), count))
    if len(free) < count:
        raise RuntimeError(f"found fewer than {count} free ports from {port} up")
    return [f"{scheme_host}:{p}" for p in free]
