"""A run owns its server: whose server answers on a port, a free port of its own when another
run holds the configured one, sharing on purpose, and restarting its own server when it dies.

Real server processes on the dummy engine (`NIP_LM_SERVER_ENGINE=dummy`), started the way a
run starts them (`flows.lm_server.lm_server_for`); the server a run uses reaches its clients
through the run's context (`served_context`), not process-wide state.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from flows import lm_server
from nip_core.agents.clients import api_endpoint
from nip_core.lm_server.launch import free_port, server_identity
from nip_core.lm_server.supervise import SupervisedServer, exit_cause, read_restarts
from nip_core.parameters import HyperParameters
from nip_core.parameters.loading import apply_overrides
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_context import build_context
from tests.conftest_lm import running_server

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def dummy_engine(monkeypatch):
    monkeypatch.setenv(lm_server.ENGINE_ENV, "dummy")


def self_hosted(port: int, *extra: str):
    hp = apply_overrides(
        HyperParameters.construct_test_params(),
        [
            "agents._default.model_provider=SelfHosted",
            "agents._default.use_dummy_api=false",
            "agents._default.language_model_server_scheme_host=http://127.0.0.1",
            f"agents._default.language_model_server_port={port}",
            *extra,
        ],
    )
    return build_context(hp, "r", 0)


def wait_until(condition, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_health_names_the_owner_the_state_folder_and_the_process(tmp_path):
    context = self_hosted(free_port())
    paths = RunPaths.open(str(tmp_path), "runA")
    with lm_server.lm_server_for(paths, context) as server:
        identity = server_identity(server.url)
        assert identity["owner"] == str(paths.run_dir)
        assert identity["state_dir"] == str((tmp_path / "runA" / "lm_server").resolve())
        assert identity["pid"] == server.process.pid
    assert server_identity(server.url) is None  # the run stopped the server it started


def test_a_second_run_gets_a_server_of_its_own_and_points_its_clients_there(tmp_path, caplog):
    port = free_port()
    context = self_hosted(port)
    run_a, run_b = RunPaths.open(str(tmp_path), "A"), RunPaths.open(str(tmp_path), "B")
    environment = dict(os.environ)
    with lm_server.lm_server_for(run_a, context) as server_a:
        assert server_a.url.endswith(f":{port}")
        with lm_server.lm_server_for(run_b, context) as server_b:
            assert server_b.url != server_a.url
            assert server_identity(server_b.url)["owner"] == str(run_b.run_dir)
            served = lm_server.served_context(context, server_b.url)
            assert api_endpoint(served.agent_params["verifier"])[0] == f"{server_b.url}/v1"
            assert api_endpoint(context.agent_params["verifier"])[0] == f"{server_a.url}/v1"
            assert dict(os.environ) == environment  # nothing process-wide says where B went
        assert f"another run's (owner {run_a.run_dir}" in caplog.text
        assert server_identity(server_a.url)["owner"] == str(run_a.run_dir)  # B left A's alone
        assert is_gone(server_b.process.pid) or server_b.process.poll() is not None


def test_a_run_inside_a_run_is_handed_the_outer_server(tmp_path, caplog):
    """An experiment opens each arm's run inside its seed's base run: one server serves both."""
    context = self_hosted(free_port())
    base, arm = RunPaths.open(str(tmp_path), "base"), RunPaths.open(str(tmp_path), "arm")
    with lm_server.lm_server_for(base, context) as outer:
        with lm_server.lm_server_for(arm, context, outer) as inner:
            assert inner is outer
            assert server_identity(inner.url)["owner"] == str(base.run_dir)
        assert "using the server of the run this one is opened inside" in caplog.text
        assert outer.process.poll() is None  # the arm's end left it running
        with lm_server.lm_server_for(arm, context, outer) as again:  # the next arm: the same
            assert again is outer
    assert server_identity(outer.url) is None


def test_served_context_points_only_self_hosted_agents_at_the_server():
    context = self_hosted(5000)
    served = lm_server.served_context(context, "http://127.0.0.1:6123")
    assert api_endpoint(served.agent_params["prover"])[0] == "http://127.0.0.1:6123/v1"
    assert served.hyper_params is context.hyper_params  # the stored configuration is untouched
    assert lm_server.served_context(context, None) is context
    dummy = build_context(HyperParameters.construct_test_params(), "r", 0)
    assert lm_server.served_context(dummy, "http://127.0.0.1:6123").agent_params == (
        dummy.agent_params
    )
    with pytest.raises(ValueError, match="scheme://host:port"):
        lm_server.served_context(context, "127.0.0.1")


def test_shared_runs_use_one_server_that_outlives_them(tmp_path):
    port = free_port()
    context = self_hosted(port, "server.shared=true")
    run_a, run_b = RunPaths.open(str(tmp_path), "A"), RunPaths.open(str(tmp_path), "B")
    with lm_server.lm_server_for(run_a, context) as server_a:
        pid = server_identity(server_a.url)["pid"]
        with lm_server.lm_server_for(run_b, context) as server_b:
            assert server_b.url == server_a.url
    identity = server_identity(server_a.url)
    try:
        assert identity["pid"] == pid and identity["owner"] == lm_server.SHARED_OWNER
        assert identity["state_dir"] == str((tmp_path / f"lm_server-shared-{port}").resolve())
    finally:
        os.kill(pid, signal.SIGTERM)


def test_a_server_started_by_hand_is_used_and_left_running(tmp_path):
    with running_server(["--engine", "dummy"], tmp_path / "by-hand") as by_hand:
        context = self_hosted(by_hand.port)
        with lm_server.lm_server_for(RunPaths.open(str(tmp_path), "A"), context) as server:
            assert server.url == by_hand.url and server.process is None
        assert server_identity(by_hand.url) is not None


def test_a_rerun_finds_its_own_server_again_and_stops_it(tmp_path):
    port = free_port()
    context = self_hosted(port)
    paths = RunPaths.open(str(tmp_path), "A")
    left = lm_server.ensure_lm_server(paths, context)  # a killed flow leaves its server running
    left.detach()
    pid = server_identity(left.url)["pid"]
    with lm_server.lm_server_for(paths, context) as server:
        assert server.url == left.url and server.pid == pid
    assert wait_until(lambda: is_gone(pid), 35)


def test_a_killed_server_is_restarted_on_its_port_and_state_folder(tmp_path):
    port = free_port()
    context = self_hosted(port)
    paths = RunPaths.open(str(tmp_path), "A")
    with lm_server.lm_server_for(paths, context) as server:
        assert isinstance(server, SupervisedServer)
        first = server.process.pid
        os.kill(first, signal.SIGKILL)
        assert wait_until(lambda: len(server.restarts) == 1)
        identity = server_identity(server.url)
        assert identity["pid"] == server.process.pid != first
        assert identity["state_dir"] == str((tmp_path / "A" / "lm_server").resolve())
        (record,) = read_restarts(tmp_path / "A" / "lm_server")
        assert record["cause"] == "killed by SIGKILL" and record["answered_after_seconds"] > 0
        assert httpx.get(f"{server.url}/v1/models").status_code == 200


def test_restarts_stop_at_the_limit_and_say_why(tmp_path):
    context = self_hosted(free_port(), "server.max_restarts=0")
    with lm_server.lm_server_for(RunPaths.open(str(tmp_path), "A"), context) as server:
        os.kill(server.process.pid, signal.SIGKILL)
        assert wait_until(lambda: server.gave_up is not None)
        assert "died (killed by SIGKILL) after 0 restarts" in server.gave_up
        assert server.restarts == [] and server_identity(server.url) is None


def test_exit_causes_read_as_words():
    assert exit_cause(-9) == "killed by SIGKILL"
    assert exit_cause(1) == "exited with 1"
    assert exit_cause(None) == "still running"


def test_a_vllm_left_by_a_killed_server_is_ended_by_the_next_one(tmp_path):
    import json
    import subprocess

    from nip_core.lm_server.engines.vllm.process import end_stale_vllm, pid_file
    from nip_core.lm_server.procs import process_start_time

    log_path = tmp_path / "vllm-8000.log"
    orphan = subprocess.Popen(["sleep", "60"], start_new_session=True)
    record = {"pid": orphan.pid, "start": process_start_time(orphan.pid)}
    pid_file(log_path, 8000).write_text(json.dumps(record))
    assert end_stale_vllm(log_path, 8001) is None  # another port's record: none
    assert end_stale_vllm(log_path, 8000) == orphan.pid
    assert orphan.wait(timeout=10) == -signal.SIGKILL
    assert end_stale_vllm(log_path, 8000) is None  # gone: nothing to end
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:  # a recycled pid (another start time) is never signalled
        pid_file(log_path, 8000).write_text(json.dumps({"pid": stranger.pid, "start": 1}))
        assert end_stale_vllm(log_path, 8000) is None and stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_no_process_wide_state_says_which_server_a_run_uses():
    """The server a run uses reaches its clients through the run's context only: no environment
    variable and no module-level registry of started servers in the pipeline's code."""
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    for top in ("flows", "tasks", "nip_core"):
        for path in (repo / top).rglob("*.py"):
            text = path.read_text()
            for stale in ("NIP_LM_SERVER_URL", "STARTED_HERE", "SERVER_URL_ENV"):
                assert stale not in text, f"{path} still names {stale}"
