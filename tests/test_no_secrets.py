"""No secret leaks: plant fake credentials, run an iteration with wandb offline, grep everything.

Everything = every file under the run folder (artifacts, manifests, call journals, the wandb
offline run with its debug logs), the Prefect API's database and the flow run's logs read back
through the API, and the captured stdout/stderr. Also checks the wandb run holds the metrics.

pytest tests/test_no_secrets.py
"""

import asyncio
import uuid
from pathlib import Path

import pytest
from pydantic import SecretStr

from flows.malt_iteration import malt_iteration
from nip_core.run.tracking import (
    RUN_ID_FILE,
    offline_logs,
    read_offline_config,
    read_offline_history,
)

PLANTED = {
    name: f"fake-{name.lower()}-{uuid.uuid4().hex}"
    for name in ("OPENAI_API_KEY", "OPENROUTER_API_KEY", "NIP_LM_SERVER_TOKEN")
}
OVERRIDES = [
    "agents._default.use_dummy_api=true",
    "rl.rollouts_per_iteration=3",
    "rl.num_iterations=1",
    "text_rl.test_scheme=all",
    "dataset_options.max_test_size=4",
    "nip_protocol.max_message_rounds=3",
]


def leaks(data: bytes) -> list[str]:
    return [name for name, value in PLANTED.items() if value.encode() in data]


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def prefect_database_dir() -> Path:
    import prefect.settings

    url = prefect.settings.get_current_settings().server.database.connection_url
    url = url.get_secret_value() if isinstance(url, SecretStr) else str(url)
    assert url.startswith("sqlite"), url
    return Path(url.split("///", 1)[1]).parent


async def flow_run_logs(flow_run_id) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async with get_client() as client:
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        )
    return "\n".join(log.message for log in logs)


@pytest.fixture
def planted_env(monkeypatch, tmp_path):
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def test_planted_credentials_never_reach_artifacts_logs_or_wandb(
    prefect_harness, planted_env, tmp_path, capfd
):
    from prefect.logging.handlers import APILogHandler

    root = tmp_path / "artifacts"
    state = malt_iteration(
        overrides=OVERRIDES, run_name="s", artifacts_root=str(root), return_state=True
    )
    stats = state.result()
    APILogHandler().flush()  # send queued logs to the API before reading them back
    run_dir = root / "s"

    # The wandb offline run is inside the run folder and holds the iteration's metrics.
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    logs = offline_logs(run_dir, run_id)
    assert logs, f"no offline wandb log under {run_dir / 'wandb'}"
    rows = [row for log in logs for row in read_offline_history(log)]
    (row,) = [r for r in rows if r.get("iteration") == 0]
    assert row["train/verifier/accuracy"] == pytest.approx(stats["verifier"]["accuracy"])
    assert row["train/nodes"] == stats["nodes"]
    assert row["eval/accuracy"] == pytest.approx(stats["eval"]["accuracy"])
    assert row["eval/rollouts"] == stats["eval"]["rollouts"] == 4
    config = read_offline_config(logs[0])  # the hyper-parameters, with the package meta
    assert config["interaction_protocol"] == "nip" and config["rl"]["rollouts_per_iteration"] == 3
    assert "_package_name" in config and "_package_version" in config

    files = files_under(run_dir)
    assert any("wandb" in p.parts and p.suffix == ".log" for p in files)  # debug logs checked
    assert (run_dir / "iterations" / "0000" / "eval.parquet") in files
    found = {str(p): leaks(p.read_bytes()) for p in files}
    assert not {p: names for p, names in found.items() if names}

    database = files_under(prefect_database_dir())
    assert database, "the Prefect test database was not found"
    assert not {str(p): leaks(p.read_bytes()) for p in database if leaks(p.read_bytes())}
    api_logs = asyncio.run(flow_run_logs(state.state_details.flow_run_id))
    assert not leaks(api_logs.encode())

    out, err = capfd.readouterr()
    assert not leaks(out.encode()) and not leaks(err.encode())
