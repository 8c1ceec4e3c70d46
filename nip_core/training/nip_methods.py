"""The reference library's method names on a shared model group, beside ours.

nip's `PureTextSharedModelGroup` builds its datasets itself from sampled timesteps; ours receive
the finished JSONL. These methods keep nip's names and argument order so code written against
the reference library keeps working; each is a thin call of our own method.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from nip_core.training.fine_tune_jobs import GroupState


class NipMethodNames:
    """Mixed into `SharedModelGroup`: nip's names for state and job creation."""

    name: str

    def get_state_dict(self) -> dict:
        """nip's name for `get_state`: the group's state as a plain dict.

        nip's `get_state` returns a state dataclass and `get_state_dict` a dict; ours both return
        the dict `{fine_tune_job_id, fine_tuned_model_name, skip_reason, failed_jobs}`.
        """
        return self.get_state()

    def set_state_dict(self, state: GroupState | Mapping[str, Any]) -> None:
        """The counterpart of `get_state_dict`: the same as `set_state` (missing keys -> None)."""
        self.set_state(state)

    def _named_job_key_and_suffix(self, job_name: str | None, key: str | None) -> tuple[str, str]:
        """The idempotency key and job suffix for the nip-named job methods."""
        if key is None:
            # same name, same group -> same job; no name -> a key no earlier job can have
            key = f"{job_name}/{self.name}" if job_name else f"{self.name}/{uuid.uuid4().hex}"
        suffix = (job_name or self.name)[-64:].lstrip("-") or self.name[-64:]
        return key, suffix

    async def create_dpo_fine_tune_job(
        self,
        jsonl: bytes,
        rows: int,
        job_name: str | None = None,
        *,
        key: str | None = None,
        from_base_model: bool = False,
    ) -> str:
        """nip's name for a DPO job: `create_fine_tune_job("dpo", ...)`; returns the job id.

        nip passes `positive_examples_per_agent` and `negative_examples_per_agent`
        (NestedArrayDicts of sampled timesteps) and builds the dataset itself. Here the caller
        passes the finished dataset instead: `jsonl`, OpenAI's preference-tuning JSONL (one
        `{"input", "preferred_output", "non_preferred_output"}` object per line, as
        `nip_core.malt.dataset_export.dpo_openai_jsonl` builds it for all the group's agents), and
        `rows`, its number of lines (checked against the provider's minimum, as in nip).

        `job_name` becomes the job's suffix (cut to OpenAI's 64 characters; the group name when
        None). `key` is the idempotency key (see `create_fine_tune_job`); when None it is
        `"<job_name>/<group>"`, so resubmitting the same name re-attaches to that job, or, with
        no `job_name`, a fresh random key (never re-attaches).
        """
        key, suffix = self._named_job_key_and_suffix(job_name, key)
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
        """nip's name for a supervised job: `create_fine_tune_job("supervised", ...)`.

        nip passes `rollouts_per_agent` and `guess_replaced_rollouts` (NestedArrayDicts of
        sampled rollouts, the latter with the verifier's guess replaced by the true label) and
        builds the chat examples itself. Here `jsonl` is the finished OpenAI chat-format JSONL
        (one `{"messages": [...]}` object per line, as `nip_core.malt.dataset_export.sft_openai_jsonl`
        builds it, guess-replaced rollouts already included)
        and `rows` its number of lines. `job_name`, `key` and `from_base_model` are as in
        `create_dpo_fine_tune_job`. Returns the job id.
        """
        key, suffix = self._named_job_key_and_suffix(job_name, key)
        return await self.create_fine_tune_job(
            "supervised", jsonl, rows, key=key, suffix=suffix, from_base_model=from_base_model
        )
