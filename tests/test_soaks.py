"""Short versions of the robustness soaks (`bench/kill_soak.py`, `bench/fault_soak.py`), and
proof that their comparison and fault proxy can fail.

pytest tests/test_soaks.py
"""

import asyncio
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.fault_proxy import FAULT_KINDS, FaultProxy, encode_reply, read_request
from bench.fault_soak import fault_soak
from bench.kill_soak import KillSoak
from bench.soak_compare import compare_runs, duplicate_jobs, job_id_map, recorded_jobs
from nip_core.agents.chat_client import SamplingParams
from nip_core.agents.http_client import DirectHttpChatClient

SMALL = [
    "rl.rollouts_per_iteration=4",
    "text_rl.rollout_shard_size=2",
    "nip_protocol.max_message_rounds=3",
]

# ------------------------------------------------------------------ the comparison


def write_run(folder: Path, nodes: list[dict], job_id: str = "ftjob-a") -> Path:
    """A hand-made run folder: config, one Parquet table, a dataset, a journal, a manifest."""
    it = folder / "run" / "iterations" / "0000"
    (it / "datasets").mkdir(parents=True)
    (it / "fine_tune").mkdir()
    (folder / "run" / "hyper_params.json").write_text('{"seed": 1}')
    pq.write_table(pa.Table.from_pylist(nodes), it / "nodes.parquet")
    (it / "datasets" / "g.jsonl").write_text('{"input": 1}\n{"input": 2}\n')
    calls = [{"key": "k1", "texts": ["a"]}, {"key": "k2", "texts": ["b"]}]
    (it / "calls-0.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    state = {"fine_tune_job_id": job_id, "failed_jobs": []}
    (it / "fine_tune" / "g.json").write_text(json.dumps({"group": "g", "state": state}))
    sha = hashlib.sha256((it / "nodes.parquet").read_bytes()).hexdigest()
    stages = {"rollouts": {"files": {"nodes.parquet": sha}, "seconds": 1.5, "info": {"n": 3}}}
    (it / "manifest.json").write_text(json.dumps({"stages": stages, "model": f"ft:{job_id}"}))
    return folder / "run"


NODES = [{"node_id": f"n{i}", "value": float(i)} for i in range(3)]


def test_equal_runs_compare_equal_despite_timings_journal_order_and_torn_lines(tmp_path):
    ref, run = write_run(tmp_path / "a", NODES), write_run(tmp_path / "b", NODES)
    manifest = run / "iterations/0000/manifest.json"
    data = json.loads(manifest.read_text())
    data["stages"]["rollouts"]["seconds"] = 9.0
    manifest.write_text(json.dumps(data))
    journal = run / "iterations/0000/calls-0.jsonl"
    lines = journal.read_text().splitlines()
    journal.write_text(f'{lines[1]}\n{{"key": "k3", "tex\n{lines[0]}\n')
    result = compare_runs(ref, run)
    assert result.problems == 0, result.differing
    assert result.files == 6 and result.torn_journal_lines == 1


def test_comparison_finds_lost_duplicate_and_changed_rows_and_files(tmp_path):
    ref = write_run(tmp_path / "a", NODES)
    lost = compare_runs(ref, write_run(tmp_path / "b", NODES[:2]))
    assert lost.lost_rows == 1 and lost.duplicate_rows == 0
    # the manifest's checksum still matches its own file, so only nodes.parquet differs
    assert [d.split(":")[0] for d in lost.differing] == ["iterations/0000/nodes.parquet"]
    doubled = compare_runs(ref, write_run(tmp_path / "c", [*NODES, NODES[0]]))
    assert doubled.duplicate_rows == 1 and doubled.lost_rows == 0
    changed = write_run(tmp_path / "d", NODES)
    (changed / "hyper_params.json").write_text('{"seed": 2}')
    (changed / "iterations/0000/datasets/g.jsonl").write_text('{"input": 1}\n')
    (changed / "iterations/0000/extra.parquet").write_bytes(b"x")
    result = compare_runs(ref, changed)
    assert result.lost_rows == 1 and len(result.differing) == 3, result.differing


def test_comparison_finds_a_journal_answer_and_a_manifest_checksum_that_differ(tmp_path):
    ref = write_run(tmp_path / "a", NODES)
    run = write_run(tmp_path / "b", NODES)
    journal = run / "iterations/0000/calls-0.jsonl"
    journal.write_text(journal.read_text().replace('["b"]', '["c"]'))
    manifest = run / "iterations/0000/manifest.json"
    data = json.loads(manifest.read_text())
    data["stages"]["rollouts"]["files"]["nodes.parquet"] = "0" * 64
    manifest.write_text(json.dumps(data))
    result = compare_runs(ref, run)
    assert result.lost_rows == 1 and result.extra_rows == 1
    names = sorted(d.split(":")[0] for d in result.differing)
    assert names == [f"iterations/0000/{n}" for n in ("calls-0.jsonl", "manifest.json")]


def test_an_unreadable_parquet_file_counts_as_all_rows_lost(tmp_path):
    ref, run = write_run(tmp_path / "a", NODES), write_run(tmp_path / "b", NODES)
    (run / "iterations/0000/nodes.parquet").write_bytes(b"garbage")
    result = compare_runs(ref, run)
    assert result.lost_rows == 3 and len(result.differing) == 2  # the file and its checksum


def test_random_job_ids_are_mapped_and_second_jobs_counted(tmp_path):
    ref = write_run(tmp_path / "a", NODES, "ftjob-a")
    run = write_run(tmp_path / "b", NODES, "ftjob-b")
    assert compare_runs(ref, run).differing  # the id is in fine_tune/g.json and the manifest
    ids = job_id_map(ref / "iterations/0000", run / "iterations/0000")
    assert ids == {"ftjob-b": "ftjob-a"}
    assert compare_runs(ref, run, ids).problems == 0
    assert duplicate_jobs(recorded_jobs(run / "iterations/0000")) == 0
    assert duplicate_jobs({"g": ["ftjob-a", "ftjob-b"], "h": ["ftjob-c"]}) == 1


# ------------------------------------------------------------------ the fault proxy


async def chat_upstream(reader, writer) -> None:
    """A minimal chat server: one choice echoing the last message."""
    while (request := await read_request(reader)) is not None:
        text = json.loads(request[3])["messages"][-1]["content"]
        reply = {"choices": [{"index": 0, "message": {"content": text}, "finish_reason": "stop"}]}
        writer.write(
            encode_reply(200, [("content-type", "application/json")], json.dumps(reply).encode())
        )
        await writer.drain()
    writer.close()


async def ask_through_proxy(count: int) -> tuple[list[str], FaultProxy]:
    server = await asyncio.start_server(chat_upstream, "127.0.0.1", 0)
    upstream = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    proxy = FaultProxy(upstream, rate=1.0, seed=0, max_faults_per_request=3)
    port = await asyncio.to_thread(proxy.start)
    client = DirectHttpChatClient(f"http://127.0.0.1:{port}/v1", None, backoff_base=0.01)
    try:
        calls = [
            client.complete([{"role": "user", "content": f"q{i}"}], "m", 1, SamplingParams())
            for i in range(count)
        ]
        return [texts[0] for texts in await asyncio.gather(*calls)], proxy
    finally:
        await client.aclose()
        await asyncio.to_thread(proxy.stop)
        server.close()


def test_fault_proxy_injects_every_kind_and_the_client_still_gets_every_answer():
    answers, proxy = asyncio.run(ask_through_proxy(3))
    assert answers == ["q0", "q1", "q2"]
    assert set(proxy.injected) == set(FAULT_KINDS) and sum(proxy.injected.values()) == 9
    assert proxy.chat_requests == 12 and proxy.forwarded == 3 + proxy.injected["truncated"]


# ------------------------------------------------------------------ the soaks, short


@pytest.fixture
def prefect_api(prefect_harness) -> dict[str, str]:
    """The test harness's Prefect API for the commands (no temporary server per start)."""
    from prefect.settings import PREFECT_API_URL

    return {"PREFECT_API_URL": PREFECT_API_URL.value()}


@pytest.mark.slow
def test_kill_soak_three_kills_lose_nothing(tmp_path, prefect_api):
    overrides = ["agents._default.use_dummy_api=true", *SMALL, "text_rl.switch_guard=false"]
    soak = KillSoak(tmp_path, kills=3, seed=2, latency=0.2, overrides=overrides, env=prefect_api)
    result = soak.run()
    assert result.kills >= 3
    assert result.problems == 0, (result, [c.differing for c in result.comparisons])


@pytest.mark.slow
def test_fault_soak_every_fault_kind_and_identical_artifacts(tmp_path, prefect_api):
    overrides = ["agents._default.model_provider=SelfHosted", *SMALL]
    overrides.append("text_rl.switch_guard_episodes=4")
    result = fault_soak(
        tmp_path, rate=0.3, seed=1, overrides=overrides, env=prefect_api, max_faults_per_request=1
    )
    assert result.exit_status == 0 and not result.missing_kinds, result.injected
    assert result.problems == 0, (result.comparison.differing, result.jobs)
