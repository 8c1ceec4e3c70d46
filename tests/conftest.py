"""Shared test set-up: an isolated Prefect home and a session-wide Prefect test harness."""

import os
import tempfile

import pytest

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="nip-prefect-home-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect API (SQLite) for tests that run flows."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield
