"""Shared model groups: agents that share one model, its fine-tune jobs and model switching.

One code path (the `openai` SDK) drives OpenAI, OpenRouter and our self-hosted server. A group
trains one model on the data of all its agents; frozen groups never train. Jobs carry an
idempotency key (run, iteration, group) in their metadata, so a restarted flow finds the job it
already submitted instead of creating a second one. nip's method names (`get_state_dict`,
`set_state_dict`, `create_dpo_fine_tune_job`, `create_supervised_fine_tune_job`) are thin calls
of ours, so code written against the reference library keeps working.
"""

from __future__ import annotations

import asyncio
import io
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, Literal

import nip_core
from nip_core.agents.chat_client import EndpointUnreachableError
from nip_core.agents.clients import provider_of, self_hosted_url
from nip_core.training.fine_tune_jobs import (
    DUMMY_JOB_ID,
    FINGERPRINT_FIELD,
    FROZEN_JOB_ID,
    GROUP_FIELD,
    INSUFFICIENT_DATA_JOB_ID,
    KEY_FIELD,
    LOCAL_JOB_IDS,
    STATUS_MAP,
    FineTuneJobError,
    GroupState,
    JobStatus,
    job_error_text,
    keyed,
    lora_training_options,
    named_job_key_and_suffix,
    reusable_and_failed,
    training_fingerprint,
    with_backoff,
)

log = logging.getLogger(__name__)


class SharedModelGroup:
    """A group of agents sharing one model (OpenAI-compatible fine-tuning API)."""

    def __init__(
        self,
        name: str,
        agent_params: Mapping[str, Any],
        *,
        rl_num_epochs: int,
        rl_learning_rate: float,
        client: Any = None,
        training_seed: int | None = None,
    ) -> None:
        self.name = name
        self.agent_params = dict(agent_params)
        first = next(iter(self.agent_params.values()))
        self.params = first
        self.base_model_name: str = first.model_name
        self.rl_num_epochs = rl_num_epochs
        self.rl_learning_rate = rl_learning_rate
        self.client = client
        self.training_seed = training_seed  # the fine-tune's data order and adapter init
        self.state = GroupState()

    # ------------------------------------------------------------------ properties

    async def aclose(self) -> None:
        """Close the fine-tuning client's connection pool (in the loop that used it)."""
        if self.client is not None and hasattr(self.client, "close"):
            await self.client.close()

    def agent_ids_and_names(self) -> list[tuple[int, str]]:
        return list(enumerate(self.agent_params))

    @property
    def is_trainable(self) -> bool:
        return not self.params.freeze_agent

    @property
    def model_name(self) -> str:
        return self.state.fine_tuned_model_name or self.base_model_name

    @property
    def lora_alpha(self) -> float:
        p = self.params
        return p.lora_alpha if p.lora_alpha is not None else p.lora_rank * p.lora_alpha_scale

    @property
    def num_epochs(self) -> int:
        return self.params.num_epochs if self.params.num_epochs is not None else self.rl_num_epochs

    @property
    def min_examples(self) -> int:
        return provider_of(self.params).min_training_examples

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict:
        return asdict(self.state)

    def set_state(self, state: GroupState | Mapping[str, Any]) -> None:
        data = asdict(state) if isinstance(state, GroupState) else dict(state)
        defaults = asdict(GroupState())
        self.state = GroupState(**{k: data.get(k, defaults[k]) for k in defaults})
        self.state.failed_jobs = list(self.state.failed_jobs or [])

    # nip's names: its `get_state` returns a dataclass and `get_state_dict` a dict; ours both
    # return the dict `{fine_tune_job_id, fine_tuned_model_name, skip_reason, failed_jobs}`.
    get_state_dict = get_state
    set_state_dict = set_state

    # ------------------------------------------------------------------ lifecycle

    async def wait_for_ready(self, timeout: float = 300.0) -> None:
        """For a self-hosted server: wait until /health answers with our package version."""
        if not provider_of(self.params).self_hosted:
            return
        import httpx

        url = f"{self_hosted_url(self.params)}/health"
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                try:
                    response = await http.get(url)
                    if response.status_code == 200:
                        version = response.json().get("version")
                        if version != nip_core.__version__:
                            raise RuntimeError(
                                f"language-model server at {url} runs version {version}, "
                                f"this package is {nip_core.__version__}"
                            )
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise EndpointUnreachableError(
                        self_hosted_url(self.params),
                        f"language-model server at {url} not ready in {timeout} s",
                    )
                await asyncio.sleep(0.5)

    async def train(self) -> None:
        """Nothing to do client-side: the self-hosted server frees the GPU when a job starts."""

    async def eval(self) -> None:
        """Nothing to do client-side: the server re-acquires the GPU after training."""

    # ------------------------------------------------------------------ jobs

    def _local_job(self, rows: int) -> str | None:
        """A job id that needs no API call (frozen, too little data, dummy), or None."""
        if not self.is_trainable:
            return FROZEN_JOB_ID
        if rows < self.min_examples:
            log.warning(
                "group %s: %d training examples, fewer than the %d required; not fine-tuning "
                "this iteration (the group keeps model %s)",
                self.name,
                rows,
                self.min_examples,
                self.model_name,
            )
            self.state.skip_reason = f"{rows} examples < {self.min_examples} required"
            return INSUFFICIENT_DATA_JOB_ID
        if provider_of(self.params).offline:
            return DUMMY_JOB_ID
        return None

    def _hyperparameters(self, method: str) -> dict:
        hyper: dict[str, Any] = {"n_epochs": self.num_epochs}
        if method in ("dpo", "kto") and self.params.dpo_beta is not None:
            hyper["beta"] = self.params.dpo_beta
        if provider_of(self.params).sends_lora_options:
            hyper["batch_size"] = self.params.per_device_train_batch_size
        return hyper

    def _api(self) -> Any:
        """The fine-tuning client, or a clear error when the group was built without one."""
        if self.client is None:
            raise FineTuneJobError(
                f"group {self.name}: no fine-tuning client (model provider "
                f"{self.params.model_provider!r}, use_dummy_api={self.params.use_dummy_api})"
            )
        return self.client

    async def find_job(self, key: str, fingerprint: str | None = None) -> str | None:
        """The id of the newest job with this key (and training fingerprint) that has not
        failed; jobs of the key that failed or were cancelled go to `state.failed_jobs`."""
        if self.client is None:
            return None
        page = await with_backoff(
            lambda: self.client.fine_tuning.jobs.list(limit=100, metadata={KEY_FIELD: key})
        )
        reusable, failed = reusable_and_failed(page.data, key, fingerprint)
        known = {entry["job_id"] for entry in self.state.failed_jobs}
        for job in failed:
            if job.id not in known:
                self.state.failed_jobs.append({"job_id": job.id, "error": job_error_text(job)})
        return reusable

    def _job_request(self, method: str, suffix: str, from_base_model: bool) -> dict[str, Any]:
        """The job request without its training file and metadata (both added on submission)."""
        from_base = from_base_model or self.params.fine_tune_from_scratch
        request: dict[str, Any] = {
            "model": self.base_model_name if from_base else self.model_name,
            "method": {"type": method, method: {"hyperparameters": self._hyperparameters(method)}},
            "suffix": suffix,
        }
        if self.training_seed is not None:
            request["seed"] = self.training_seed
        if provider_of(self.params).sends_lora_options:
            extension = lora_training_options(
                self.params, self.lora_alpha, self.rl_learning_rate, method
            )
            request["extra_body"] = {"nip_training": extension}
        return request

    async def create_fine_tune_job(
        self,
        method: Literal["supervised", "dpo", "kto"],
        jsonl: bytes,
        rows: int,
        *,
        key: str,
        suffix: str,
        from_base_model: bool = False,
    ) -> str:
        """Submit (or re-attach to) this iteration's job; returns and records its id.

        The job trains the group's current model, or the base model when `from_base_model` or
        the group's `fine_tune_from_scratch` is set. `key` is extended with the fingerprint of
        the training data and settings, so only a job that trains the same re-attaches, and a
        job that failed is replaced by a new one.
        """
        local = self._local_job(rows)
        if local is not None:
            self.state.fine_tune_job_id = local
            return local
        request = self._job_request(method, suffix, from_base_model)
        fingerprint = training_fingerprint(request, jsonl)
        full_key = keyed(key, fingerprint)
        existing = await self.find_job(full_key, fingerprint)
        if existing is not None:
            log.info("group %s: re-attaching to existing job %s (%s)", self.name, existing, key)
            self.state.fine_tune_job_id = existing
            return existing
        client = self._api()
        upload = await with_backoff(
            lambda: client.files.create(
                file=(f"{suffix}.jsonl", io.BytesIO(jsonl)), purpose="fine-tune"
            )
        )
        request["training_file"] = upload.id
        request["metadata"] = {
            KEY_FIELD: full_key,
            FINGERPRINT_FIELD: fingerprint,
            GROUP_FIELD: self.name,
        }
        job = await with_backoff(lambda: client.fine_tuning.jobs.create(**request))
        self.state.fine_tune_job_id = job.id
        return job.id

    async def create_dpo_fine_tune_job(
        self,
        jsonl: bytes,
        rows: int,
        job_name: str | None = None,
        *,
        key: str | None = None,
        from_base_model: bool = False,
    ) -> str:
        """nip's name for `create_fine_tune_job("dpo", ...)`; returns the job id. nip builds
        the dataset from sampled timesteps; here `jsonl` is OpenAI's preference-tuning JSONL
        (`dataset_export.dpo_openai_jsonl`) and `rows` its line count. Key and suffix:
        `named_job_key_and_suffix` (the same `job_name` re-attaches to its job)."""
        key, suffix = named_job_key_and_suffix(self.name, job_name, key)
        return await self.create_fine_tune_job(
            "dpo", jsonl, rows, key=key, suffix=suffix, from_base_model=from_base_model
        )

    async def create_supervised_fine_tune_job(
        self,
        jsonl: bytes,
        rows: int,
        job_name: str | None = None,
        *,
        key: str | None = None,
        from_base_model: bool = False,
    ) -> str:
        """nip's name for `create_fine_tune_job("supervised", ...)`, as
        `create_dpo_fine_tune_job`; `jsonl` is OpenAI's chat-format JSONL
        (`dataset_export.sft_openai_jsonl`, guess-replaced rollouts included)."""
        key, suffix = named_job_key_and_suffix(self.name, job_name, key)
        return await self.create_fine_tune_job(
            "supervised", jsonl, rows, key=key, suffix=suffix, from_base_model=from_base_model
        )

    async def _job(self):
        client = self._api()
        return await with_backoff(
            lambda: client.fine_tuning.jobs.retrieve(self.state.fine_tune_job_id)
        )

    async def get_fine_tune_job_status(self) -> JobStatus:
        job_id = self.state.fine_tune_job_id
        if job_id is None:
            raise FineTuneJobError(f"group {self.name} has no fine-tune job")
        if job_id in LOCAL_JOB_IDS:
            return "succeeded"
        import openai

        try:
            job = await self._job()
        except openai.NotFoundError:
            return "not_found"
        if job.status not in STATUS_MAP:
            raise FineTuneJobError(f"job {job_id}: unknown status {job.status!r}")
        return STATUS_MAP[job.status]  # type: ignore[return-value]

    async def fine_tune_job_failed(self) -> bool:
        return await self.get_fine_tune_job_status() in ("failed", "cancelled", "not_found")

    async def get_fine_tune_job_error_repr(self) -> str:
        if self.state.fine_tune_job_id in LOCAL_JOB_IDS:
            return "no error"
        return job_error_text(await self._job())

    def _next_dummy_iteration(self) -> int:
        """One past the iteration in the current dummy model's name (0 if there is none)."""
        current = self.state.fine_tuned_model_name or ""
        match = re.fullmatch(rf"dummy-ft:{re.escape(self.name)}:it(\d+)", current)
        return int(match.group(1)) + 1 if match else 0

    async def switch_to_next_model(self, iteration: int | None = None) -> str:
        """Adopt the fine-tuned model (or keep the current one when nothing was trained).

        Returns the group's model name after the switch. `iteration` only names the model a
        dummy-API job "produces", `dummy-ft:<group>:it<iteration>`. Called without it, as in
        nip, that suffix counts on from the current model: one past the iteration in the current
        dummy model's name, or 0 when the group still uses its base model (or a real one). So
        a group switched once per iteration from iteration 0 gets the same names either way,
        also after `set_state`. Real jobs name their model themselves; frozen and
        insufficient-data jobs ignore it.
        """
        if iteration is None:
            iteration = self._next_dummy_iteration()
        job_id = self.state.fine_tune_job_id
        if job_id is None:
            raise FineTuneJobError(f"group {self.name}: no fine-tune job to switch from")
        if job_id == FROZEN_JOB_ID:
            self.state.fine_tuned_model_name = None
        elif job_id == DUMMY_JOB_ID:
            self.state.fine_tuned_model_name = f"dummy-ft:{self.name}:it{iteration}"
        elif job_id != INSUFFICIENT_DATA_JOB_ID:
            job = await self._job()
            if job.status != "succeeded" or not job.fine_tuned_model:
                raise FineTuneJobError(
                    f"group {self.name}: job {job_id} is {job.status}, cannot switch model"
                )
            self.state.fine_tuned_model_name = job.fine_tuned_model
        return self.model_name


def build_groups(
    groups: Mapping[str, Sequence[str]],
    agent_params: Mapping[str, Any],
    *,
    rl_num_epochs: int,
    rl_learning_rate: float,
    clients: Mapping[str, Any],
    training_seed: int | None = None,
) -> dict[str, SharedModelGroup]:
    """One SharedModelGroup per group name; `clients` maps group -> openai.AsyncOpenAI."""
    return {
        name: SharedModelGroup(
            name,
            {a: agent_params[a] for a in agents},
            rl_num_epochs=rl_num_epochs,
            rl_learning_rate=rl_learning_rate,
            client=clients.get(name),
            training_seed=training_seed,
        )
        for name, agents in groups.items()
    }
