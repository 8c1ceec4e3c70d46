"""A real `prefect server start`, `python -m flows.serve`, a deployment run, its table artifact.

pytest -m slow tests/test_prefect_server.py      (about a minute on 2 cores)
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.script_modules import load_script

REPO = Path(__file__).resolve().parent.parent


# The server helpers live in the documented screenshot script; reuse them.
shots = load_script("screenshot_prefect_ui")


def wait_for(predicate, timeout: float, what: str, process=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what}: serving process exited with {process.returncode}")
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def deployment(api: str, name: str) -> dict | None:
    response = httpx.get(f"{api}/deployments/name/{name}", timeout=10)
    return response.json() if response.status_code == 200 else None


def test_prefect_yaml_declares_every_deployment_with_limit_one():
    config = yaml.safe_load((REPO / "prefect.yaml").read_text())
    from prefect.cli.deploy._models import PrefectYamlModel  # the schema `prefect deploy` uses

    model = PrefectYamlModel.model_validate(config)
    by_name = {d.name: d for d in model.deployments}
    assert set(by_name) == {"malt-iteration", "malt-run", "experiment"}
    from prefect.flows import load_flow_from_entrypoint

    for name, spec in by_name.items():
        flow = load_flow_from_entrypoint(str(REPO / spec.entrypoint))
        assert flow.name == name
        assert {"overrides", "run_name"} <= set(spec.parameters)
        assert set(spec.parameters) <= set(flow.parameters.properties)
        assert spec.concurrency_limit.limit == 1


def test_serve_builds_every_deployment_with_concurrency_limit():
    from flows.serve import deployments

    built = {d.name: d for d in deployments()}
    assert set(built) == {"malt-iteration", "malt-run", "experiment"}
    for d in built.values():
        assert d.concurrency_limit == 1 or d.concurrency_limit.limit == 1
    with pytest.raises(ValueError, match="unknown deployment"):
        deployments(["nope"])


@pytest.mark.slow
def test_deployment_run_completes_and_publishes_table(tmp_path):
    home, root = tmp_path / "prefect-home", tmp_path / "artifacts"
    with shots.prefect_server(home, ui=False, log=tmp_path / "server.log") as api:
        env = shots.server_env(home, api)
        serve_log = open(tmp_path / "serve.log", "w")  # noqa: SIM115
        server = subprocess.Popen(
            [sys.executable, "-m", "flows.serve", "--only", "malt-iteration"],
            cwd=REPO,
            env=env,
            stdout=serve_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            found = wait_for(
                lambda: deployment(api, "malt-iteration/malt-iteration"),
                90,
                "the served deployment",
                server,
            )
            limit = (found.get("global_concurrency_limit") or {}).get("limit")
            assert limit == 1 or found.get("concurrency_limit") == 1, found
            state = trigger_and_wait(api, env, str(root))
        finally:
            shots.stop(server)
            serve_log.close()
        assert state["type"] == "COMPLETED", (tmp_path / "serve.log").read_text()[-3000:]
        rows = read_table(api, env)
    assert {row["agent"] for row in rows} == {"prover", "verifier"}
    manifest = json.loads((root / "srv" / "iterations" / "0000" / "manifest.json").read_text())
    for row in rows:
        agent = manifest["stats"]["agents"][row["agent"]]
        assert (row["pairs"], row["active_nodes"]) == (agent["pairs"], agent["active_nodes"])
        assert row["nodes"] == manifest["stats"]["nodes"]
    assert not (root / "srv" / ".lock").exists()


def run_in_client(env: dict, code: str, timeout: float) -> str:
    """Talk to the server with Prefect's own client, in a process with its PREFECT_API_URL."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def trigger_and_wait(api: str, env: dict, root: str) -> dict:
    """`run_deployment` with the dummy backend; waits for a final state."""
    parameters = {
        "overrides": ["agents._default.use_dummy_api=true", "rl.rollouts_per_iteration=4"],
        "run_name": "srv",
        "artifacts_root": root,
        "use_wandb": False,
    }
    code = (
        "import json\n"
        "from prefect.deployments import run_deployment\n"
        f"run = run_deployment('malt-iteration/malt-iteration', parameters={parameters!r},"
        " timeout=240, poll_interval=1)\n"
        "print(json.dumps({'type': run.state.type.value, 'message': run.state.message}))\n"
    )
    return json.loads(run_in_client(env, code, timeout=300))


def read_table(api: str, env: dict) -> list[dict]:
    code = (
        "from prefect.client.orchestration import get_client\n"
        "from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey\n"
        "with get_client(sync_client=True) as client:\n"
        "    found = client.read_artifacts(artifact_filter=ArtifactFilter("
        "key=ArtifactFilterKey(any_=['srv-iteration-table'])))\n"
        "print(found[0].data if isinstance(found[0].data, str) else __import__('json')"
        ".dumps(found[0].data))\n"
    )
    return json.loads(run_in_client(env, code, timeout=60))
