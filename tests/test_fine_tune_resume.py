"""SIGKILL the flow while its fine-tune jobs run; the rerun re-attaches and never submits twice.

Generation and fine-tuning both go through the real server process (dummy engine, whose fake
training takes a few seconds) via the `openai` SDK, exactly as with a real model.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest_lm import REPO, running_server

pytestmark = pytest.mark.slow


def overrides(port: int) -> list[str]:
    return [
        "agents._default.model_provider=SelfHosted",
        "agents._default.use_dummy_api=false",
        "agents._default.model_name=SmolLM2-135M-Instruct",
        "agents._default.language_model_server_scheme_host=http://127.0.0.1",
        f"agents._default.language_model_server_port={port}",
        "rl.rollouts_per_iteration=6",
        "nip_protocol.max_message_rounds=3",
    ]


def test_kill_during_fine_tune_then_rerun_submits_each_job_once(tmp_path):
    with running_server(
        ["--engine", "dummy", "--fake-train-seconds", "8"], tmp_path / "state"
    ) as server:
        args = [
            sys.executable,
            "-m",
            "flows.malt_iteration",
            "--no-wandb",
            "--run-name",
            "ft",
            "--artifacts-root",
            str(tmp_path / "art"),
        ]
        args += [f"--set={o}" for o in overrides(server.port)]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        record = tmp_path / "art" / "ft" / "iterations" / "0000" / "fine_tune" / "verifier.json"
        flow = subprocess.Popen(  # its own process group: the kill takes Prefect's server too
            args,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 300
        while not record.exists():
            assert flow.poll() is None, flow.communicate()
            assert time.monotonic() < deadline, "the fine-tune job was never submitted"
            time.sleep(0.05)
        os.killpg(flow.pid, signal.SIGKILL)
        flow.wait()
        client = server.client()
        running = client.fine_tuning.jobs.list(limit=100).data
        assert running and any(
            j.status in ("queued", "running", "validating_files") for j in running
        )

        rerun = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        # SDK clients are closed in the loop that used them, not by the garbage collector later
        assert "Event loop is closed" not in rerun.stderr + rerun.stdout

        jobs = client.fine_tuning.jobs.list(limit=100).data
        keys = [j.metadata["nip_job_key"] for j in jobs]
        assert len(keys) == len(set(keys)), f"a job was submitted twice: {keys}"
        # run/iteration/group, then the fingerprint of the training data and settings
        assert any(key.startswith("ft/0000/verifier/") for key in keys), keys
        assert all(j.status == "succeeded" for j in jobs)
        manifest = json.loads((record.parent.parent / "manifest.json").read_text())
        models = manifest["models_after"]
        by_id = {j.id: j.fine_tuned_model for j in jobs}
        state = json.loads(record.read_text())["state"]
        # the fine-tuned model goes in unless the switch guard kept the previous one
        verdict = manifest["stages"]["switch_guard"]["info"]["verifier"]["verdict"]
        fine_tuned = by_id[state["fine_tune_job_id"]]
        assert models["verifier"] == (
            fine_tuned if verdict == "switched" else "SmolLM2-135M-Instruct"
        )
