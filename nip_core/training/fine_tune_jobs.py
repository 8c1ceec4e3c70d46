"""Fine-tune jobs on an OpenAI-compatible API: their identity, requests and statuses.

A job's idempotency key names the run, iteration and group *and* a fingerprint of what it trains
(the JSONL bytes, the model trained from, the method and every training setting). A rerun
re-attaches to a pending, running or succeeded job with the same key, never to one trained on
other data; a job that failed or was cancelled is never re-attached, so a rerun submits a new
one (the failed job's id and error stay in the group's state).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from nip_core.agents.clients import api_endpoint, provider_of
from nip_core.agents.retry import RetryPolicy
from nip_core.parameters.agents import PureTextAgentParameters

log = logging.getLogger(__name__)

JobStatus = Literal["pending", "running", "succeeded", "failed", "cancelled", "not_found"]
DUMMY_JOB_ID = "dummy_job_id"
FROZEN_JOB_ID = "frozen_job_id"
INSUFFICIENT_DATA_JOB_ID = "insufficient_data_job_id"
LOCAL_JOB_IDS = {DUMMY_JOB_ID, FROZEN_JOB_ID, INSUFFICIENT_DATA_JOB_ID}
STATUS_MAP: dict[str, JobStatus] = {
    "validating_files": "pending",
    "queued": "pending",
    "running": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
}
KEY_FIELD, FINGERPRINT_FIELD, GROUP_FIELD = "nip_job_key", "nip_training_fingerprint", "nip_group"


class FineTuneJobError(RuntimeError):
    """A fine-tune job failed, was cancelled or vanished."""


@dataclass
class GroupState:
    fine_tune_job_id: str | None = None
    fine_tuned_model_name: str | None = None
    skip_reason: str | None = None
    # Jobs of this iteration that failed before the current one: [{"job_id", "error"}, ...]
    failed_jobs: list[dict] = field(default_factory=list)


def job_key(run_name: str, iteration: int, group: str) -> str:
    """The readable part of a job's idempotency key; `keyed` adds the training fingerprint."""
    return f"{run_name}/{iteration:04d}/{group}"


def job_suffix(run_name: str, iteration: int, group: str) -> str:
    """A job name short enough for OpenAI's 64-character suffix limit (nip §8.21)."""
    return f"{run_name}-it{iteration}-{group}"[-64:].lstrip("-")


def named_job_key_and_suffix(group: str, job_name: str | None, key: str | None) -> tuple[str, str]:
    """The idempotency key and job suffix of a job created under nip's method names: the key as
    given, else `"<job_name>/<group>"` (the same name re-attaches), else a random one (never
    re-attaches); the suffix is `job_name` (or the group) cut to OpenAI's 64 characters."""
    if key is None:
        key = f"{job_name}/{group}" if job_name else f"{group}/{uuid.uuid4().hex}"
    suffix = (job_name or group)[-64:].lstrip("-") or group[-64:]
    return key, suffix


def lora_training_options(
    params: Any, lora_alpha: float, learning_rate: float, method: str
) -> dict:
    """Our server's LoRA options for a `method` job (sent in the request body; OpenAI does not
    get them)."""
    options = {
        "use_lora": params.use_lora,
        "lora_rank": params.lora_rank,
        "lora_alpha": lora_alpha,
        "lora_dropout": params.lora_dropout,
        "stack_lora_adapters": params.stack_lora_adapters,
        "quantization": params.quantization,
        "learning_rate": learning_rate,
        "loss_type": params.dpo_loss_type,
        "rpo_alpha": params.dpo_rpo_alpha,
        "gradient_accumulation_steps": params.gradient_accumulation_steps,
        "shuffle": params.shuffle_training_data,
    }
    if params.lora_top_layers is not None:  # unset: the fingerprint as before
        options["lora_top_layers"] = params.lora_top_layers
    if params.training_activation_checkpointing is not None:  # unset: the fingerprint as before
        options["activation_checkpointing"] = params.training_activation_checkpointing
    stop_at = params.training_stop_at_pair_accuracy
    if stop_at is not None and method == "dpo":  # only DPO logs pair accuracies
        options["stop_at_pair_accuracy"] = stop_at
    if not params.training_prompt_gradients and method == "dpo":  # only DPO pairs share one
        options["prompt_gradients"] = False
    if params.training_precision != "auto":  # unset: the fingerprint as before
        options["precision"] = params.training_precision
    return options


def training_fingerprint(request: dict[str, Any], jsonl: bytes) -> str:
    """16 hex digits identifying the training data and settings of a job request."""
    settings = {k: v for k, v in request.items() if k not in ("training_file", "metadata")}
    blob = json.dumps(settings, sort_keys=True, default=str).encode() + b"\0" + jsonl
    return hashlib.sha256(blob).hexdigest()[:16]


def keyed(key: str, fingerprint: str) -> str:
    """The full idempotency key: `<run>/<iteration>/<group>/<fingerprint>`."""
    return f"{key}/{fingerprint}"


_API_RETRY = RetryPolicy(attempts=6, base_seconds=1.0, cap_seconds=60.0)


async def with_backoff(call):
    """`call()`, retried on rate-limit, quota and transient server/connection errors."""
    return await _API_RETRY.call("fine-tuning API", call)


def reusable_and_failed(jobs: list[Any], key: str, fingerprint: str) -> tuple[str | None, list]:
    """(id of the newest job with this key and fingerprint that has not failed, the jobs that
    failed or were cancelled). `jobs` come newest first, as the API lists them."""
    reusable, failed = None, []
    for job in jobs:
        metadata = job.metadata or {}
        if metadata.get(KEY_FIELD) != key:
            continue
        if metadata.get(FINGERPRINT_FIELD, fingerprint) != fingerprint:
            log.warning("job %s has key %s but other training data; not re-attaching", job.id, key)
            continue
        if STATUS_MAP.get(job.status) in ("failed", "cancelled"):
            failed.append(job)
        elif reusable is None:
            reusable = job.id
    return reusable, failed


def fine_tuning_client(agent_params: PureTextAgentParameters) -> Any:
    """An `openai.AsyncOpenAI` for the group's fine-tuning API (None for the dummy API)."""
    if provider_of(agent_params).offline:
        return None
    import openai

    base_url, key_env = api_endpoint(agent_params)
    key = os.environ.get(key_env or "", "")
    if not key and provider_of(agent_params).key_required:
        raise RuntimeError(
            f"set {key_env} in the environment to fine-tune with {base_url or 'OpenAI'}"
        )
    return openai.AsyncOpenAI(base_url=base_url, api_key=key or "EMPTY", max_retries=0)


def job_error_text(job: Any) -> str:
    """A job's error as one line (nip's `get_fine_tune_job_error_repr` format)."""
    error = job.error
    if error is None:
        return f"job {job.id} has status {job.status} and no error message"
    text = f"Code: {error.code}. Message: {error.message}."
    return text + (f" Parameter: {error.param}." if error.param else "")
