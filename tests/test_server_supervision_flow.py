"""A run whose model server goes away: its own is restarted and the run finishes in the same
invocation; an endpoint it does not own ends the run with one `error:` line and exit code 3."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from flows.cli import ENDPOINT_GONE_EXIT, run_command, unreachable_endpoint
from nip_core.agents.chat_client import ModelCallError
from nip_core.lm_server.launch import free_port, server_identity
from tests.conftest_lm import REPO


def test_a_model_call_that_reached_no_server_names_the_endpoint():
    gone = ModelCallError("gave up", transient=True, unreachable_url="http://127.0.0.1:5123/v1")
    try:
        try:
            raise gone
        except ModelCallError as inner:
            raise RuntimeError("rollout task failed") from inner
    except RuntimeError as outer:
        assert unreachable_endpoint(outer) == "http://127.0.0.1:5123/v1"
    assert unreachable_endpoint(ModelCallError("HTTP 400", status=400)) is None
    assert unreachable_endpoint(ValueError("bad config")) is None


def test_a_refused_connection_names_its_host_and_port():
    with pytest.raises(httpx.ConnectError) as caught:
        httpx.get(f"http://127.0.0.1:{free_port()}/health", timeout=2)
    url = unreachable_endpoint(BaseExceptionGroup("tasks", [caught.value]))
    assert url is not None and url.startswith("http://127.0.0.1:")


def test_a_server_gone_mid_run_is_one_error_line_and_exit_3(capsys):
    def run(_):
        raise ModelCallError("gave up", transient=True, unreachable_url="http://10.0.0.9:5000/v1")

    args = argparse.Namespace(debug=False)
    assert run_command(args, lambda: None, run) == ENDPOINT_GONE_EXIT == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the model server at http://10.0.0.9:5000/v1")
    assert "rerun the same command" in err[0]


@pytest.mark.slow
def test_a_run_whose_own_server_is_killed_finishes_in_the_same_invocation(tmp_path):
    port = free_port()
    command = [
        sys.executable, "-m", "flows.malt_iteration", "--run-name", "killed",
        "--artifacts-root", str(tmp_path), "--no-wandb",
        "--set", f"agents._default.language_model_server_port={port}",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), NIP_LM_SERVER_ENGINE="dummy")
    flow = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url, iteration = f"http://127.0.0.1:{port}", tmp_path / "killed" / "iterations" / "0000"
        deadline = time.monotonic() + 240
        while not iteration.exists() or server_identity(url) is None:
            assert flow.poll() is None and time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
        os.kill(server_identity(url)["pid"], signal.SIGKILL)
        output = flow.communicate(timeout=300)[0].decode(errors="replace")
    finally:
        if flow.poll() is None:
            flow.kill()
    assert flow.returncode == 0, output[-3000:]
    manifest = json.loads((iteration / "manifest.json").read_text())
    (restart,) = manifest["server_restarts"]
    assert restart["cause"] == "killed by SIGKILL" and "answered_after_seconds" in restart
    assert "restarting it (1 of at most 3)" in output
    assert server_identity(url) is None  # stopped at the end, restarted one included


def test_an_unreachable_endpoint_error_names_itself():
    from nip_core.agents.chat_client import EndpointUnreachableError

    error = EndpointUnreachableError("http://127.0.0.1:5000", "not ready in 300 s")
    assert unreachable_endpoint(RuntimeError("stage failed").with_traceback(None)) is None
    try:
        raise RuntimeError("fine-tune stage failed") from error
    except RuntimeError as outer:
        assert unreachable_endpoint(outer) == "http://127.0.0.1:5000"
