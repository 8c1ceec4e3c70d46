"""A whole iteration on an S3 artifacts root (a local moto server): kill and resume with
identical files, the run reader on s3://, and the lease lock."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from nip_core.agents.call_journal import read_journal  # noqa: E402
from nip_core.report import read_run  # noqa: E402
from nip_core.run import object_store_lock as lease  # noqa: E402
from nip_core.run.lock import RunLockedError, run_lock  # noqa: E402
from tests.resume_checks import assert_only_unjournaled_calls_repeat  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BUCKET = "nip-runs"
OVERRIDES = [
    "agents._default.use_dummy_api=true",
    "rl.rollouts_per_iteration=6",
    "text_rl.rollout_shard_size=2",
    "nip_protocol.max_message_rounds=4",
]
FILES = [
    "batch.parquet",
    "nodes.parquet",
    "rewards.parquet",
    "pairs.parquet",
    "datasets/dpo/prover.parquet",
    "datasets/dpo/verifier.parquet",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on a free loopback port, and the environment that points s3fs at it."""
    import s3fs

    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(endpoint_url=env["AWS_ENDPOINT_URL"])
    fs.mkdir(BUCKET)
    try:
        yield fs, env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def cli(root: str, run: str, env: dict, **kwargs) -> subprocess.Popen:
    args = [sys.executable, "-m", "flows.malt_iteration", "--run-name", run]
    args += ["--artifacts-root", root, "--no-wandb"] + [f"--set={o}" for o in OVERRIDES]
    return subprocess.Popen(
        args, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs,
    )  # fmt: skip


@pytest.mark.slow
def test_iteration_on_s3_survives_sigkill_and_reads_back(s3):
    fs, env = s3
    root = f"s3://{BUCKET}/runs"
    whole = cli(root, "whole", env)
    out, err = whole.communicate(timeout=600)
    assert whole.returncode == 0, err[-3000:]

    call_log = Path(fs_tmp := os.environ.get("TMPDIR", "/tmp")) / f"s3-calls-{os.getpid()}.log"
    call_log.unlink(missing_ok=True)
    slow = {**env, "NIP_DUMMY_LATENCY": "0.3", "NIP_DUMMY_CALL_LOG": str(call_log)}
    killed = f"{BUCKET}/runs/killed/iterations/0000"
    process = cli(root, "killed", slow)
    deadline = time.monotonic() + 240
    while (
        not fs.exists(f"{killed}/calls-0.jsonl.d")
        or len(fs.ls(f"{killed}/calls-0.jsonl.d", refresh=True)) < 2
    ):
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "generation never started"
        time.sleep(0.1)
        fs.invalidate_cache()
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    fs.invalidate_cache()
    assert not fs.exists(f"{killed}/nodes.parquet")
    before = call_log.read_text().splitlines()
    journaled = set()
    for folder in fs.glob(f"{killed}/calls-*.jsonl.d"):
        journaled |= set(read_journal(folder.removesuffix(".d"), fs))

    resumed = cli(root, "killed", slow)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    # A call whose answer was journaled before the kill is never made again; one that finished
    # while its group commit was still on its way to the store (a PUT in flight) may be.
    assert_only_unjournaled_calls_repeat(before, call_log.read_text().splitlines(), journaled)
    fs.invalidate_cache()
    for name in FILES:
        assert fs.cat_file(f"{killed}/{name}") == fs.cat_file(
            f"{BUCKET}/runs/whole/iterations/0000/{name}"
        ), name
    assert not fs.exists(f"{BUCKET}/runs/killed/.lock")  # released at the end

    run = read_run(f"s3://{BUCKET}/runs/whole")
    assert run.iterations == [0] and len(run.nodes(0)) > 0
    assert run.stats["iteration"].tolist() == [0]
    call_log.unlink(missing_ok=True)
    del fs_tmp


def test_the_lease_lock_excludes_a_second_run_and_expires(s3, monkeypatch):
    fs, _ = s3
    folder = f"{BUCKET}/locks/run"
    with run_lock(folder, local=False, fs=fs) as held:
        assert held == f"{folder}/.lock" and fs.exists(held)
        with pytest.raises(RunLockedError, match="in use"), run_lock(folder, local=False, fs=fs):
            pass
    assert not fs.exists(f"{folder}/.lock")
    # A holder that died: its lease runs out and the next run takes over.
    monkeypatch.setattr(lease, "LEASE_SECONDS", 0.5)
    lease.acquire_lease(fs, f"{folder}/.lock")  # never released
    time.sleep(0.7)
    with run_lock(folder, local=False, fs=fs):
        pass
