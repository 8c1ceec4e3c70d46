"""HTTP-layer tests of the language-model server with the dummy engine, through the openai SDK.

Every test talks to a real `python -m nip_core.lm_server` process; the dummy engine answers with
canned text and fakes training in a real child process, so the job lifecycle is exercised fully.
"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import openai
import pytest

import nip_core
from nip_core.lm_server.procs import is_alive, kill_group
from tests.conftest_lm import Server, dpo_lines, running_server, sft_lines, upload, wait_job

BASE = "SmolLM2-135M-Instruct"
USER = [{"role": "user", "content": "Is this code correct?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(["--engine", "dummy"], tmp_path_factory.mktemp("dummy") / "state") as srv:
        yield srv


@pytest.fixture
def client(server):
    return server.client()


def test_health_reports_version_and_engine(server):
    body = httpx.get(server.url + "/health").json()
    identity = {key: body.pop(key) for key in ("owner", "state_dir", "pid")}
    assert body == {"status": "ok", "version": nip_core.__version__, "engine": "dummy"}
    assert identity["owner"] is None  # started by hand, so no run owns it
    assert identity["pid"] == server.proc.pid
    assert identity["state_dir"] == str(server.state_dir)


def test_chat_returns_n_choices_with_usage(client):
    reply = client.chat.completions.create(
        model=BASE,
        messages=USER,
        n=3,
        temperature=1.0,
        seed=1,
        extra_body={"repetition_penalty": 1.1},
    )
    texts = [c.message.content for c in reply.choices]
    assert len(texts) == 3 and len(set(texts)) == 3
    assert all(c.finish_reason == "stop" for c in reply.choices)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens > 0
    again = client.chat.completions.create(model=BASE, messages=USER, n=3, temperature=1.0, seed=1)
    assert [c.message.content for c in again.choices] == texts


def test_max_tokens_gives_length_finish_reason(client):
    reply = client.chat.completions.create(model=BASE, messages=USER, max_tokens=2)
    assert reply.choices[0].finish_reason == "length"


def test_unknown_model_is_404_naming_the_available_ones(client):
    with pytest.raises(openai.NotFoundError, match=f"'nope' is not served here.*{BASE}"):
        client.chat.completions.create(model="nope", messages=USER)


def test_bad_sampling_value_is_400(client):
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=BASE, messages=USER, temperature=7)


def test_file_upload_is_stored(client, server):
    uploaded = upload(client, sft_lines(2))
    assert client.files.retrieve(uploaded.id).bytes == uploaded.bytes > 0
    stored = server.state_dir / "files" / uploaded.id / "content"
    assert json.loads(stored.read_text().splitlines()[0])["messages"][2]["role"] == "assistant"
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-doesnotexist")


def test_dpo_job_succeeds_and_new_model_is_served(client):
    training_file = upload(client, dpo_lines(3)).id
    job = client.fine_tuning.jobs.create(
        model=BASE,
        training_file=training_file,
        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.3, "n_epochs": 2}}},
        suffix="verifier",
        metadata={"idempotency_key": "k-dpo-1"},
        extra_body={"nip_training": {"lora_rank": 8, "lora_alpha": 16}},
    )
    assert job.status == "queued"
    done = wait_job(client, job.id)
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model == f"ft:{BASE}:verifier:{job.id}"
    assert done.hyperparameters.n_epochs == 2
    assert done.model_extra["nip_training"]["lora_alpha"] == 16
    assert done.fine_tuned_model in [m.id for m in client.models.list()]
    answer = client.chat.completions.create(model=done.fine_tuned_model, messages=USER)
    assert done.fine_tuned_model in answer.choices[0].message.content
    found = client.fine_tuning.jobs.list(metadata={"idempotency_key": "k-dpo-1"}).data
    assert [j.id for j in found] == [job.id]
    assert client.fine_tuning.jobs.list(metadata={"idempotency_key": "other"}).data == []
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id)]
    assert messages[0].startswith("New model created") and messages[-1].startswith("Created")


def test_each_job_gets_a_new_model_name_and_list_is_newest_first(client):
    training_file = upload(client, sft_lines(2)).id
    ids = [
        client.fine_tuning.jobs.create(model=BASE, training_file=training_file).id for _ in range(2)
    ]
    names = {wait_job(client, i).fine_tuned_model for i in ids}
    assert len(names) == 2
    listed = [j.id for j in client.fine_tuning.jobs.list(limit=2).data]
    assert listed == ids[::-1]
    after = client.fine_tuning.jobs.list(limit=1, after=ids[1]).data
    assert [j.id for j in after] == [ids[0]]


def test_malformed_dataset_fails_with_readable_error(client):
    bad = json.dumps(dpo_lines(1)[0]) + "\n" + json.dumps({"input": {"messages": []}}) + "\n"
    job = client.fine_tuning.jobs.create(
        model=BASE, training_file=upload(client, bad).id, method={"type": "dpo"}
    )
    done = wait_job(client, job.id)
    assert done.status == "failed" and done.fine_tuned_model is None
    assert done.error.code == "invalid_training_file"
    assert "line 2" in done.error.message and "input.messages" in done.error.message


def test_supervised_line_without_assistant_fails(client):
    lines = [{"messages": [{"role": "user", "content": "hi"}]}]
    job = client.fine_tuning.jobs.create(model=BASE, training_file=upload(client, lines).id)
    done = wait_job(client, job.id)
    assert done.status == "failed" and "line 1" in done.error.message
    assert "no assistant message" in done.error.message


def test_bitsandbytes_without_cuda_fails_clearly(client):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    job = client.fine_tuning.jobs.create(
        model=BASE,
        training_file=upload(client, sft_lines(1)).id,
        extra_body={"nip_training": {"quantization": "bitsandbytes"}},
    )
    done = wait_job(client, job.id)
    assert done.status == "failed" and "needs a CUDA GPU" in done.error.message


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"nip_training": {"lora_rank": 0}}, "lora_rank"),
        ({"nip_training": {"use_lora": "yes"}}, "use_lora"),
        ({"nip_training": {"lora_rnak": 8}}, "lora_rnak"),
        ({"method": {"type": "ppo"}}, "method.type"),
        ({"metadata": {"k": 1}}, "metadata"),
    ],
)
def test_invalid_job_options_are_400(client, extra, needle):
    training_file = upload(client, sft_lines(1)).id
    with pytest.raises(openai.BadRequestError, match=needle):
        client.fine_tuning.jobs.create(model=BASE, training_file=training_file, extra_body=extra)


def test_job_on_unknown_model_or_file_is_404(client):
    training_file = upload(client, sft_lines(1)).id
    with pytest.raises(openai.NotFoundError, match="gpt-9"):
        client.fine_tuning.jobs.create(model="gpt-9", training_file=training_file)
    with pytest.raises(openai.NotFoundError, match="file-missing"):
        client.fine_tuning.jobs.create(model=BASE, training_file="file-missing")
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.retrieve("ftjob-missing")


def test_load_lora_adapter_bad_path_is_400(server, tmp_path):
    response = httpx.post(
        server.url + "/v1/load_lora_adapter",
        json={"lora_name": "x", "lora_path": str(server.state_dir / "missing")},
    )
    assert response.status_code == 400
    assert "does not exist" in response.json()["error"]["message"]
    unload = httpx.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "never"})
    assert unload.status_code == 404 and "never" in unload.json()["error"]["message"]


def test_load_and_unload_adapter_by_hand(server, client):
    adapter = server.state_dir / "by-hand" / "adapter"  # adapters load from the state folder
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    body = {"lora_name": "hand-made", "lora_path": str(adapter)}
    assert httpx.post(server.url + "/v1/load_lora_adapter", json=body).status_code == 200
    assert "hand-made" in [m.id for m in client.models.list()]
    client.chat.completions.create(model="hand-made", messages=USER)
    response = httpx.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "hand-made"})
    assert response.status_code == 200
    assert "hand-made" not in [m.id for m in client.models.list()]


def test_token_auth(tmp_path):
    with running_server(["--engine", "dummy"], tmp_path / "state", token="s3cret") as srv:
        assert httpx.get(srv.url + "/health").status_code == 200
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        wrong = openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            wrong.models.list()
        assert "s3cret" not in str(info.value)
        assert [m.id for m in srv.client().models.list()] == [BASE]


def _running_job(client) -> str:
    job = client.fine_tuning.jobs.create(model=BASE, training_file=upload(client, sft_lines(1)).id)
    wait_job(client, job.id, states=("running", "succeeded", "failed"))
    assert client.fine_tuning.jobs.retrieve(job.id).status == "running"
    return job.id


def _job_record(state_dir, job_id) -> dict:
    return json.loads((state_dir / "jobs" / job_id / "job.json").read_text())


def test_cancel_running_job_ends_its_process(tmp_path):
    args = ["--engine", "dummy", "--fake-train-seconds", "120"]
    with running_server(args, tmp_path / "state") as srv:
        client = srv.client()
        job_id = _running_job(client)
        record = _job_record(srv.state_dir, job_id)
        assert is_alive(record["_pid"], record["_pid_start"])
        cancelled = client.fine_tuning.jobs.cancel(job_id)
        assert cancelled.status == "cancelled" and cancelled.fine_tuned_model is None
        assert not is_alive(record["_pid"], record["_pid_start"])
        with pytest.raises(openai.BadRequestError, match="already cancelled"):
            client.fine_tuning.jobs.cancel(job_id)
        queued_behind = client.fine_tuning.jobs.create(
            model=BASE, training_file=upload(client, sft_lines(1)).id
        )
        assert client.fine_tuning.jobs.cancel(queued_behind.id).status in ("cancelled",)


def test_restart_keeps_state_reattaches_and_fails_orphans_past_the_restart_limit(tmp_path):
    state = tmp_path / "state"
    quick = ["--engine", "dummy"]
    with running_server(quick, state) as srv:
        client = srv.client()
        done = wait_job(
            client,
            client.fine_tuning.jobs.create(
                model=BASE, training_file=upload(client, sft_lines(1)).id, suffix="keep"
            ).id,
        )
        assert done.status == "succeeded"
    slow = ["--engine", "dummy", "--fake-train-seconds", "120"]
    first = Server(slow, state).wait_ready()
    client = first.client()
    survivor = _running_job(client)
    first.stop(signal.SIGTERM)  # the child outlives a graceful stop
    record = _job_record(state, survivor)
    assert is_alive(record["_pid"], record["_pid_start"])
    second = Server(slow, state).wait_ready()
    try:
        client = second.client()
        assert done.fine_tuned_model in [m.id for m in client.models.list()]
        assert client.fine_tuning.jobs.retrieve(done.id).status == "succeeded"
        assert client.fine_tuning.jobs.retrieve(survivor).status == "running"
        victim = client.fine_tuning.jobs.cancel(survivor)  # re-attached: cancel still works
        assert victim.status == "cancelled" and not is_alive(record["_pid"], record["_pid_start"])
        orphan = _running_job(client)
    finally:
        second.stop(signal.SIGKILL)
    orphan_record = _job_record(state, orphan)
    kill_group(orphan_record["_pid"], orphan_record["_pid_start"], grace=2)  # dies with the server
    with running_server([*quick, "--max-training-restarts", "0"], state) as third:
        client = third.client()
        failed = client.fine_tuning.jobs.retrieve(orphan)
        assert failed.status == "failed" and failed.error.code == "server_restarted"
        assert "died with the server" in failed.error.message
        assert client.fine_tuning.jobs.retrieve(done.id).status == "succeeded"
        time.sleep(0.5)
        assert client.fine_tuning.jobs.retrieve(orphan).status == "failed"


def _training_restarts(client, job_id: str) -> list[str]:
    events = client.fine_tuning.jobs.list_events(job_id, limit=100).data
    return [e.message for e in events if "training again from the start" in e.message]


def _sigkill_training(record: dict) -> None:
    os.killpg(record["_pid"], signal.SIGKILL)  # the child leads its own process group
    deadline = time.monotonic() + 10
    while is_alive(record["_pid"], record["_pid_start"]) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_job_killed_with_its_server_trains_again_under_the_same_id(tmp_path):
    """Training child and server SIGKILLed together (an OOM kill of the box): the restarted
    server queues the job again and it succeeds under its own id and model name."""
    state = tmp_path / "state"
    first = Server(["--engine", "dummy", "--fake-train-seconds", "2"], state).wait_ready()
    try:
        job_id = _running_job(first.client())
        record = _job_record(state, job_id)
    finally:
        first.stop(signal.SIGKILL)
    _sigkill_training(record)
    with running_server(["--engine", "dummy"], state) as second:
        client = second.client()
        done = wait_job(client, job_id)
        assert done.status == "succeeded", done.error
        assert done.fine_tuned_model == record["_new_model_name"]
        assert done.fine_tuned_model in [m.id for m in client.models.list()]
        assert [j.id for j in client.fine_tuning.jobs.list().data] == [job_id]
        assert _training_restarts(client, job_id) == [
            f"the training process (pid {record['_pid']}) died with the server; training again "
            "from the start (restart 1 of at most 2)"
        ]


def test_a_killed_training_process_trains_again_until_the_limit(tmp_path):
    """A training child killed by a signal while the server lives (the OOM killer) trains again;
    past `--max-training-restarts` the job fails."""
    args = ["--engine", "dummy", "--fake-train-seconds", "3", "--max-training-restarts", "1"]
    with running_server(args, tmp_path / "state") as srv:
        client = srv.client()
        job_id = _running_job(client)
        first = _job_record(srv.state_dir, job_id)
        _sigkill_training(first)
        deadline = time.monotonic() + 30
        while _job_record(srv.state_dir, job_id).get("_pid") in (None, first["_pid"]):
            assert time.monotonic() < deadline, "the job was not started again"
            time.sleep(0.1)
        assert _training_restarts(client, job_id) == [
            f"the training process (pid {first['_pid']}) was killed by a signal; training again "
            "from the start (restart 1 of at most 1)"
        ]
        second = _job_record(srv.state_dir, job_id)
        _sigkill_training(second)
        failed = wait_job(client, job_id)
        assert failed.status == "failed" and failed.error.code == "training_crashed"
        assert len(_training_restarts(client, job_id)) == 1
