"""Shared test set-up: an isolated Prefect home, a session-wide Prefect test harness, and the
longest tests first (the suite runs on two pytest-xdist workers: a long test started last would
leave one worker idle while it finishes)."""

import os
import tempfile

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # a Prefect home per worker, not the controller's
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="nip-prefect-home-")
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


# Measured on the 2-core CI machine: each of these takes 30 s to 4 min; the rest take seconds.
LONGEST_FIRST = (
    "test_vllm_cpu.py",
    "test_object_store.py",
    "test_experiment_flow.py",
    "test_fine_tune_resume.py",
    "test_prefect_server.py",
    "test_flow_iteration.py",
)


def pytest_collection_modifyitems(items):
    """Start the longest test files first, in a fixed order (every xdist worker must collect the
    same order)."""

    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a rank is pytest's


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report carries the state and log tail of every server it had running:
    a server that died shows on the client only as a reset connection."""
    report = yield
    if report.failed:
        from tests.conftest_lm import LIVE_SERVERS

        for server in LIVE_SERVERS:
            report.sections.append(("language-model server", server.describe()))
    return report
