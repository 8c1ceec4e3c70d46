"""Prefect tasks: one module per stage, each a thin wrapper (under 90 lines) calling `nip_core`.

Shared here: the retry policy of the stages that touch the network. A Prefect retry repeats a
whole stage, so it runs only after a transient failure (`nip_core.agents.retry.is_transient`):

    @task(name="generate-rollouts", **TRANSIENT_RETRY)
"""

from __future__ import annotations

import logging
from typing import Any

from nip_core.agents.retry import is_transient

log = logging.getLogger(__name__)


def _state_exception(state: Any) -> BaseException | None:
    """The exception a failed Prefect state carries (None if it carries none)."""
    data = getattr(state, "data", None)
    if isinstance(data, BaseException):
        return data
    try:
        result = state.result(raise_on_failure=False)
    except Exception as e:  # a state whose result cannot be read: judge what was raised
        return e
    return result if isinstance(result, BaseException) else None


def retry_transient_only(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry the task run only after a transient failure."""
    error = _state_exception(state)
    retry = error is not None and is_transient(error)
    name = getattr(task, "name", "task")
    if retry:
        log.warning("%s failed with a transient error, retrying: %r", name, error)
    else:
        log.info("%s failed with a permanent error, not retrying: %r", name, error)
    return retry


TRANSIENT_RETRY: dict[str, Any] = {
    "retries": 2,
    "retry_delay_seconds": [10, 60],
    "retry_condition_fn": retry_transient_only,
}
