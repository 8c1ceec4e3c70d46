"""Shared model groups against a fake async fine-tuning client (no network)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import httpx
import openai
import pytest

from nip_core.parameters.agents import PureTextAgentParameters
from nip_core.training import fine_tune_jobs as mg
from nip_core.training.fine_tune_jobs import (
    DUMMY_JOB_ID,
    FROZEN_JOB_ID,
    INSUFFICIENT_DATA_JOB_ID,
    FineTuneJobError,
    GroupState,
    fine_tuning_client,
    job_key,
    job_suffix,
)
from nip_core.training.model_groups import SharedModelGroup, build_groups

BASE = "gpt-4o-mini-2024-07-18"


def _http_error(cls, status: int):
    request = httpx.Request("GET", "https://api.example/v1/fine_tuning/jobs")
    return cls("fake error", response=httpx.Response(status, request=request), body=None)


class FakeJobs:
    def __init__(self) -> None:
        self.jobs: dict[str, SimpleNamespace] = {}
        self.created: list[dict] = []
        self.list_calls: list[dict] = []
        self.fail_next_list: list[Exception] = []

    async def list(self, **kwargs):
        self.list_calls.append(kwargs)
        if self.fail_next_list:
            raise self.fail_next_list.pop(0)
        return SimpleNamespace(data=list(self.jobs.values()))  # ignores the filter on purpose

    async def create(self, **request):
        self.created.append(request)
        job = SimpleNamespace(
            id=f"ftjob-{len(self.jobs) + 1}",
            status="queued",
            metadata=request.get("metadata"),
            fine_tuned_model=None,
            error=None,
        )
        self.jobs[job.id] = job
        return job

    async def retrieve(self, job_id: str):
        if job_id not in self.jobs:
            raise _http_error(openai.NotFoundError, 404)
        return self.jobs[job_id]


class FakeFiles:
    def __init__(self) -> None:
        self.uploads: list[tuple[str, bytes, str]] = []

    async def create(self, *, file, purpose):
        name, handle = file
        self.uploads.append((name, handle.read(), purpose))
        return SimpleNamespace(id=f"file-{len(self.uploads)}")


class FakeClient:
    def __init__(self) -> None:
        self.fine_tuning = SimpleNamespace(jobs=FakeJobs())
        self.files = FakeFiles()

    @property
    def jobs(self) -> FakeJobs:
        return self.fine_tuning.jobs


def params(**changes) -> PureTextAgentParameters:
    return replace(PureTextAgentParameters(model_name=BASE), **changes)


def group(client=None, agents=("verifier",), **changes) -> SharedModelGroup:
    return SharedModelGroup(
        "grp",
        {a: params(**changes) for a in agents},
        rl_num_epochs=2,
        rl_learning_rate=3e-5,
        client=client,
    )


def create(
    g: SharedModelGroup,
    rows: int = 12,
    method="dpo",
    key="run/0000/grp",
    suffix="s",
    jsonl=b'{"a": 1}\n',
):
    return asyncio.run(g.create_fine_tune_job(method, jsonl, rows, key=key, suffix=suffix))


# ---------------------------------------------------------------- local job ids


def test_frozen_group_gets_frozen_job_without_api_calls():
    client = FakeClient()
    g = group(client, freeze_agent=True)
    assert not g.is_trainable
    assert create(g, rows=0) == FROZEN_JOB_ID
    assert g.get_state()["fine_tune_job_id"] == FROZEN_JOB_ID
    assert client.jobs.created == [] and client.files.uploads == [] and client.jobs.list_calls == []


@pytest.mark.parametrize(
    ("provider", "rows", "expected"),
    [("OpenAI", 9, True), ("OpenAI", 10, False), ("SelfHosted", 0, True), ("SelfHosted", 1, False)],
)
def test_too_few_examples_give_insufficient_data_job(provider, rows, expected):
    client = FakeClient()
    g = group(client, model_provider=provider)
    job = create(g, rows=rows)
    assert (job == INSUFFICIENT_DATA_JOB_ID) == expected
    assert (client.jobs.created == []) == expected
    if expected:
        assert g.state.skip_reason == f"{rows} examples < {g.min_examples} required"


def test_dummy_api_gets_dummy_job_after_the_data_check():
    g = group(None, use_dummy_api=True)
    assert create(g, rows=3) == INSUFFICIENT_DATA_JOB_ID
    assert create(g, rows=10) == DUMMY_JOB_ID


# ---------------------------------------------------------------- job submission


def test_create_uploads_the_data_and_submits_a_tagged_job():
    client = FakeClient()
    g = group(client, num_epochs=3, dpo_beta=0.2)
    job_id = create(g, rows=12, key="run/0002/grp", suffix="run-it2-grp")
    assert job_id == "ftjob-1" and g.state.fine_tune_job_id == job_id
    assert client.files.uploads == [("run-it2-grp.jsonl", b'{"a": 1}\n', "fine-tune")]
    (request,) = client.jobs.created
    assert request["model"] == BASE and request["training_file"] == "file-1"
    assert request["method"] == {
        "type": "dpo",
        "dpo": {"hyperparameters": {"n_epochs": 3, "beta": 0.2}},
    }
    assert request["suffix"] == "run-it2-grp"
    fingerprint = request["metadata"]["nip_training_fingerprint"]
    assert len(fingerprint) == 16
    assert request["metadata"] == {
        "nip_job_key": f"run/0002/grp/{fingerprint}",
        "nip_training_fingerprint": fingerprint,
        "nip_group": "grp",
    }
    assert "extra_body" not in request  # OpenAI gets no LoRA options


def test_lora_top_layers_is_sent_only_when_set():
    """Unset, the request (and so its fingerprint) is what it was before the setting existed."""
    sent = []
    for top in (None, 10):
        client = FakeClient()
        create(group(client, model_provider="SelfHosted", lora_top_layers=top), rows=1)
        sent.append(client.jobs.created[0]["extra_body"]["nip_training"])
    assert "lora_top_layers" not in sent[0] and sent[1]["lora_top_layers"] == 10


def test_self_hosted_job_carries_lora_options_and_batch_size():
    client = FakeClient()
    g = group(client, model_provider="SelfHosted", lora_rank=16, lora_alpha_scale=2.0)
    create(g, rows=1, method="supervised")
    (request,) = client.jobs.created
    assert request["method"] == {
        "type": "supervised",
        "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": 2}},
    }
    extension = request["extra_body"]["nip_training"]
    assert extension["lora_alpha"] == 32.0 and extension["lora_rank"] == 16
    assert extension["learning_rate"] == 3e-5
    assert "activation_checkpointing" not in extension  # unset: the server decides
    create(group(client, model_provider="SelfHosted", training_activation_checkpointing=False))
    assert client.jobs.created[1]["extra_body"]["nip_training"]["activation_checkpointing"] is False


def test_continued_training_starts_from_the_current_model():
    client = FakeClient()
    g = group(client, fine_tune_from_scratch=False)
    g.set_state({"fine_tuned_model_name": "ft:previous"})
    create(g)
    assert client.jobs.created[0]["model"] == "ft:previous"
    scratch = group(client)
    scratch.set_state({"fine_tuned_model_name": "ft:previous"})
    create(scratch, key="other")
    assert client.jobs.created[1]["model"] == BASE


def test_a_restarted_group_reattaches_to_its_job():
    client = FakeClient()
    first = create(group(client), key="run/0001/grp")
    other = create(group(client), key="run/0001/other")  # a job with another key
    assert other != first
    restarted = group(client)  # fresh state, as after a crash
    assert create(restarted, key="run/0001/grp") == first
    assert restarted.state.fine_tune_job_id == first
    assert len(client.jobs.created) == 2 and len(client.files.uploads) == 2
    fingerprint = client.jobs.created[0]["metadata"]["nip_training_fingerprint"]
    assert client.jobs.list_calls[-1]["metadata"] == {"nip_job_key": f"run/0001/grp/{fingerprint}"}


def test_same_key_other_training_data_or_settings_never_reattaches():
    """Another run with the same name (other data, other settings) gets a job of its own."""
    client = FakeClient()
    first = create(group(client), key="run/0001/grp", jsonl=b'{"a": 1}\n')
    other_data = create(group(client), key="run/0001/grp", jsonl=b'{"a": 2}\n')
    other_settings = create(group(client, dpo_beta=0.5), key="run/0001/grp")
    assert len({first, other_data, other_settings}) == 3
    fingerprints = {job["metadata"]["nip_training_fingerprint"] for job in client.jobs.created}
    assert len(fingerprints) == 3


def test_reattaching_checks_the_fingerprint_in_the_metadata():
    client = FakeClient()
    first = create(group(client), key="run/0001/grp")
    job = client.jobs.jobs[first]
    job.metadata = {**job.metadata, "nip_training_fingerprint": "0" * 16}  # trained on other data
    assert create(group(client), key="run/0001/grp") != first


@pytest.mark.parametrize("status", ["failed", "cancelled"])
def test_a_failed_job_is_replaced_and_remembered(status):
    client = FakeClient()
    first = create(group(client), key="run/0001/grp")
    client.jobs.jobs[first].status = status
    client.jobs.jobs[first].error = SimpleNamespace(code="oom", message="out of memory", param=None)
    rerun = group(client)
    second = create(rerun, key="run/0001/grp")
    assert second != first and len(client.jobs.created) == 2
    assert rerun.state.failed_jobs == [
        {"job_id": first, "error": "Code: oom. Message: out of memory."}
    ]
    assert rerun.get_state()["failed_jobs"][0]["job_id"] == first
    assert create(group(client), key="run/0001/grp") == second  # the new job is reused


@pytest.mark.parametrize("status", ["queued", "running", "succeeded"])
def test_a_live_or_finished_job_is_reattached(status):
    client = FakeClient()
    first = create(group(client), key="run/0001/grp")
    client.jobs.jobs[first].status = status
    assert create(group(client), key="run/0001/grp") == first
    assert len(client.jobs.created) == 1


def test_transient_errors_are_retried(monkeypatch):
    monkeypatch.setattr(mg._API_RETRY, "base_seconds", 0.0)  # no back-off delay
    client = FakeClient()
    client.jobs.fail_next_list = [
        _http_error(openai.RateLimitError, 429),
        _http_error(openai.InternalServerError, 500),
    ]
    assert create(group(client)) == "ftjob-1"
    assert len(client.jobs.list_calls) == 3


def test_permanent_errors_propagate(monkeypatch):
    monkeypatch.setattr(mg._API_RETRY, "base_seconds", 0.0)
    client = FakeClient()
    client.jobs.fail_next_list = [_http_error(openai.BadRequestError, 400)]
    with pytest.raises(openai.BadRequestError):
        create(group(client))
    assert len(client.jobs.list_calls) == 1 and client.jobs.created == []


# ---------------------------------------------------------------- status and switching


def status(g: SharedModelGroup) -> str:
    return asyncio.run(g.get_fine_tune_job_status())


@pytest.mark.parametrize(
    ("remote", "expected"),
    [
        ("validating_files", "pending"),
        ("queued", "pending"),
        ("running", "running"),
        ("succeeded", "succeeded"),
        ("failed", "failed"),
        ("cancelled", "cancelled"),
    ],
)
def test_remote_status_mapping(remote, expected):
    client = FakeClient()
    g = group(client)
    create(g)
    client.jobs.jobs["ftjob-1"].status = remote
    assert status(g) == expected
    failed = asyncio.run(g.fine_tune_job_failed())
    assert failed == (expected in ("failed", "cancelled"))


def test_unknown_missing_and_local_statuses():
    client = FakeClient()
    g = group(client)
    with pytest.raises(FineTuneJobError, match="has no fine-tune job"):
        status(g)
    create(g)
    client.jobs.jobs["ftjob-1"].status = "paused"
    with pytest.raises(FineTuneJobError, match="unknown status 'paused'"):
        status(g)
    g.set_state({"fine_tune_job_id": "ftjob-gone"})
    assert status(g) == "not_found" and asyncio.run(g.fine_tune_job_failed())
    for local in (FROZEN_JOB_ID, DUMMY_JOB_ID, INSUFFICIENT_DATA_JOB_ID):
        g.set_state({"fine_tune_job_id": local})
        assert status(g) == "succeeded"
        assert asyncio.run(g.get_fine_tune_job_error_repr()) == "no error"


def test_error_repr():
    client = FakeClient()
    g = group(client)
    create(g)
    job = client.jobs.jobs["ftjob-1"]
    job.status = "failed"
    assert "has status failed and no error message" in asyncio.run(g.get_fine_tune_job_error_repr())
    job.error = SimpleNamespace(code="invalid_file", message="bad line 3", param="training_file")
    assert asyncio.run(g.get_fine_tune_job_error_repr()) == (
        "Code: invalid_file. Message: bad line 3. Parameter: training_file."
    )
    job.error = SimpleNamespace(code="x", message="y", param=None)
    assert asyncio.run(g.get_fine_tune_job_error_repr()) == "Code: x. Message: y."


def switch(g: SharedModelGroup, iteration: int = 4) -> str:
    return asyncio.run(g.switch_to_next_model(iteration))


def test_switch_to_next_model_for_each_kind_of_job():
    client = FakeClient()
    g = group(client)
    with pytest.raises(FineTuneJobError, match="no fine-tune job"):
        switch(g)
    create(g)
    with pytest.raises(FineTuneJobError, match="is queued"):
        switch(g)
    job = client.jobs.jobs["ftjob-1"]
    job.status, job.fine_tuned_model = "succeeded", "ft:gpt:grp:1"
    assert switch(g) == "ft:gpt:grp:1" and g.model_name == "ft:gpt:grp:1"
    g.set_state({**g.get_state(), "fine_tune_job_id": INSUFFICIENT_DATA_JOB_ID})
    assert switch(g) == "ft:gpt:grp:1"  # too little data: keep the current model
    g.set_state({**g.get_state(), "fine_tune_job_id": DUMMY_JOB_ID})
    assert switch(g, 4) == "dummy-ft:grp:it4"
    g.set_state({**g.get_state(), "fine_tune_job_id": FROZEN_JOB_ID})
    assert switch(g) == BASE and g.state.fine_tuned_model_name is None


# ---------------------------------------------------------------- state and settings


def test_state_round_trip():
    g = group()
    assert g.get_state() == {
        "fine_tune_job_id": None,
        "fine_tuned_model_name": None,
        "skip_reason": None,
        "failed_jobs": [],
    }
    g.set_state(GroupState("ftjob-9", "ft:m", None))
    other = group()
    other.set_state(g.get_state())
    assert other.get_state() == g.get_state() and other.model_name == "ft:m"
    other.set_state({"fine_tune_job_id": "ftjob-1"})  # missing keys reset to None
    assert other.get_state()["fine_tuned_model_name"] is None and other.model_name == BASE


def test_lora_alpha_and_num_epochs():
    assert group(lora_alpha=24, lora_alpha_scale=None).lora_alpha == 24
    assert group(lora_rank=8, lora_alpha_scale=4.0).lora_alpha == 32.0
    assert group(num_epochs=5).num_epochs == 5
    assert group().num_epochs == 2  # falls back to rl.num_epochs


def test_job_names():
    assert job_key("run", 3, "verifier") == "run/0003/verifier"
    assert job_suffix("run", 3, "verifier") == "run-it3-verifier"
    long = job_suffix("x" * 100 + "-", 12, "prover0")
    assert len(long) <= 64 and long.endswith("-it12-prover0") and not long.startswith("-")
    edge = job_suffix("a" + "-" * 60, 1, "verifier")
    assert len(edge) <= 64 and not edge.startswith("-")


def test_build_groups_and_fine_tuning_clients(monkeypatch):
    agent_params = {"prover": params(), "verifier": params(), "judge": params(use_dummy_api=True)}
    client = FakeClient()
    groups = build_groups(
        {"shared": ("prover", "verifier"), "judge": ("judge",)},
        agent_params,
        rl_num_epochs=1,
        rl_learning_rate=1e-5,
        clients={"shared": client},
    )
    assert list(groups["shared"].agent_params) == ["prover", "verifier"]
    assert groups["shared"].agent_ids_and_names() == [(0, "prover"), (1, "verifier")]
    assert groups["shared"].client is client and groups["judge"].client is None
    assert fine_tuning_client(params(use_dummy_api=True)) is None
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="OPENAI_API_KEY"):
        fine_tuning_client(params())
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    assert fine_tuning_client(params()).api_key == "sk-secret-value"


def test_a_real_provider_without_a_client_is_a_clear_error():
    g = group(None)
    with pytest.raises(FineTuneJobError, match="no fine-tuning client"):
        create(g)
    g.set_state({"fine_tune_job_id": "ftjob-1"})
    with pytest.raises(FineTuneJobError, match="no fine-tuning client"):
        status(g)


# ---------------------------------------------------------------- nip's method names


def test_create_dpo_fine_tune_job_is_a_named_dpo_job():
    client = FakeClient()
    g = group(client, dpo_beta=0.1)
    job_id = asyncio.run(g.create_dpo_fine_tune_job(b'{"a": 1}\n', 12, job_name="run-it3-grp"))
    assert job_id == "ftjob-1" and g.state.fine_tune_job_id == job_id
    assert client.files.uploads == [("run-it3-grp.jsonl", b'{"a": 1}\n', "fine-tune")]
    (request,) = client.jobs.created
    assert request["method"]["type"] == "dpo" and request["suffix"] == "run-it3-grp"
    assert request["method"]["dpo"]["hyperparameters"] == {"n_epochs": 2, "beta": 0.1}
    fingerprint = request["metadata"]["nip_training_fingerprint"]
    assert request["metadata"]["nip_job_key"] == f"run-it3-grp/grp/{fingerprint}"
    # the same name and data re-attach (idempotent); a long name is cut to 64 characters
    again = group(client, dpo_beta=0.1)  # same settings too
    assert asyncio.run(again.create_dpo_fine_tune_job(b'{"a": 1}\n', 12, "run-it3-grp")) == job_id
    long = asyncio.run(group(client).create_dpo_fine_tune_job(b"x\n", 12, "-" + "n" * 70))
    assert long == "ftjob-2" and client.jobs.created[-1]["suffix"] == "n" * 64
    # an explicit key wins; the local job ids still apply
    asyncio.run(group(client).create_dpo_fine_tune_job(b"x\n", 12, key="run/0003/grp"))
    assert client.jobs.created[-1]["metadata"]["nip_job_key"].startswith("run/0003/grp/")
    assert client.jobs.created[-1]["suffix"] == "grp"  # no name: the group name
    assert asyncio.run(group(client).create_dpo_fine_tune_job(b"", 0)) == INSUFFICIENT_DATA_JOB_ID


def test_create_supervised_fine_tune_job_is_a_named_supervised_job():
    client = FakeClient()
    g = group(client, fine_tune_from_scratch=False)
    g.set_state({"fine_tuned_model_name": "ft:previous"})
    job_id = asyncio.run(g.create_supervised_fine_tune_job(b'{"messages": []}\n', 10))
    (request,) = client.jobs.created
    assert job_id == "ftjob-1" and request["method"]["type"] == "supervised"
    assert request["model"] == "ft:previous" and request["suffix"] == "grp"
    # without a name or key every call is a new job (a random key never re-attaches)
    first_key = request["metadata"]["nip_job_key"]
    asyncio.run(group(client).create_supervised_fine_tune_job(b"x\n", 10, from_base_model=True))
    assert client.jobs.created[1]["metadata"]["nip_job_key"] != first_key
    assert client.jobs.created[1]["model"] == BASE
    frozen = group(client, freeze_agent=True)
    assert asyncio.run(frozen.create_supervised_fine_tune_job(b"", 0, "n")) == FROZEN_JOB_ID
    dummy = group(None, use_dummy_api=True)
    assert asyncio.run(dummy.create_supervised_fine_tune_job(b"x\n", 10, "n")) == DUMMY_JOB_ID


def test_state_dict_aliases():
    g = group()
    assert g.get_state_dict() == g.get_state()
    g.set_state_dict({"fine_tune_job_id": "ftjob-3", "fine_tuned_model_name": "ft:m"})
    assert g.get_state() == {
        "fine_tune_job_id": "ftjob-3",
        "fine_tuned_model_name": "ft:m",
        "skip_reason": None,
        "failed_jobs": [],
    }
    assert g.model_name == "ft:m"
    other = group()
    other.set_state_dict(GroupState("ftjob-4", None, "why"))
    assert other.get_state_dict()["skip_reason"] == "why"


def test_switch_to_next_model_without_an_iteration():
    g = group(None, use_dummy_api=True)
    names = []
    for _ in range(3):
        asyncio.run(g.create_fine_tune_job("dpo", b"x\n", 10, key="k", suffix="s"))
        names.append(asyncio.run(g.switch_to_next_model()))
    assert names == ["dummy-ft:grp:it0", "dummy-ft:grp:it1", "dummy-ft:grp:it2"]
    restored = group(None, use_dummy_api=True)  # counts on after a restore, too
    restored.set_state_dict({**g.get_state_dict(), "fine_tune_job_id": DUMMY_JOB_ID})
    assert asyncio.run(restored.switch_to_next_model()) == "dummy-ft:grp:it3"
    assert asyncio.run(restored.switch_to_next_model(7)) == "dummy-ft:grp:it7"  # given: used
    # real jobs name their model themselves
    client = FakeClient()
    real = group(client)
    create(real)
    job = client.jobs.jobs["ftjob-1"]
    job.status, job.fine_tuned_model = "succeeded", "ft:gpt:grp:1"
    assert asyncio.run(real.switch_to_next_model()) == "ft:gpt:grp:1"


def test_a_self_hosted_server_that_never_answers_is_named_as_unreachable():
    from nip_core.agents.chat_client import EndpointUnreachableError
    from nip_core.lm_server.launch import free_port

    port = free_port()
    g = group(
        model_provider="SelfHosted",
        language_model_server_scheme_host="http://127.0.0.1",
        language_model_server_port=port,
    )
    with pytest.raises(EndpointUnreachableError, match="not ready") as caught:
        asyncio.run(g.wait_for_ready(timeout=0.5))
    assert caught.value.url == f"http://127.0.0.1:{port}"
