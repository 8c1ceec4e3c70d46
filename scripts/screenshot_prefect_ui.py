"""Screenshot the Prefect UI of a MALT iteration with headless Chromium.

    python scripts/screenshot_prefect_ui.py --out screenshots/
    python scripts/screenshot_prefect_ui.py --out screenshots/ --api-url http://127.0.0.1:4200/api

Without --api-url it starts a throw-away `prefect server start` (own PREFECT_HOME, analytics off,
free loopback port), runs one dummy-backend iteration and a two-iteration `malt_run` against it
and registers the `malt-run` deployment, then shoots the iteration's flow-run page, its table
artifact, the `malt_run` page (one subflow run per iteration) and the deployment's run form (the
typed settings); with --api-url it shoots the newest runs of that server. Installs the Debian packages `chromium` and `chromium-driver` when Chromium is
missing (needs root and apt). Prints the PNG paths.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))  # how Chromium is found and installed lives in one place
from screenshot_report import QUIET_FLAGS, ensure_chromium  # noqa: E402

DUMMY_OVERRIDES = ["agents._default.use_dummy_api=true", "rl.rollouts_per_iteration=4"]
CHROMIUM_FLAGS = [*QUIET_FLAGS, "--window-size=1400,1000", "--virtual-time-budget=15000"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(home: Path, api_url: str | None = None) -> dict[str, str]:
    """Environment for an isolated Prefect process (own home, no analytics, quiet)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY="false",
        PREFECT_LOGGING_LEVEL="WARNING",
    )
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def wait_healthy(api_url: str, timeout: float = 120.0, process: subprocess.Popen | None = None):
    """Poll `<api>/health` until the server answers; fail early if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"prefect server exited with code {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"Prefect API at {api_url} not healthy after {timeout:.0f} s")


def stop(process: subprocess.Popen, grace: float = 15.0) -> None:
    """Terminate a process we started (its whole process group), then kill if needed."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, 15)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
        process.wait(grace)


@contextlib.contextmanager
def prefect_server(home: Path, ui: bool = True, log: Path | None = None) -> Iterator[str]:
    """A `prefect server start` on a free loopback port; yields its API URL."""
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--analytics-off", "--ui" if ui else "--no-ui"]
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
    # The UI asks its settings endpoint where the API is; without this it says 127.0.0.1:4200.
    env = {**server_env(home), "PREFECT_UI_API_URL": api_url}
    process = subprocess.Popen(
        cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_healthy(api_url, process=process)
        yield api_url
    finally:
        stop(process)
        if log:
            out.close()


def run_dummy_iteration(api_url: str, root: Path, home: Path, run_name: str) -> None:
    cmd = [sys.executable, "-m", "flows.malt_iteration", "--run-name", run_name]
    cmd += ["--artifacts-root", str(root), "--no-wandb"]
    for override in DUMMY_OVERRIDES:
        cmd += ["--set", override]
    subprocess.run(cmd, cwd=REPO, env=server_env(home, api_url), check=True, timeout=300)


def run_dummy_malt_run(api_url: str, root: Path, home: Path, run_name: str) -> None:
    cmd = [sys.executable, "-m", "flows.malt_run", "--run-name", run_name]
    cmd += ["--artifacts-root", str(root), "--no-wandb", "--set", "rl.num_iterations=2"]
    for override in DUMMY_OVERRIDES:
        cmd += ["--set", override]
    subprocess.run(cmd, cwd=REPO, env=server_env(home, api_url), check=True, timeout=300)


def register_deployment(api_url: str, home: Path, name: str = "malt-run") -> None:
    """Register a deployment (without serving it) so the UI shows its parameter form."""
    code = f"from flows.serve import deployments; [d.apply() for d in deployments([{name!r}])]"
    env = server_env(home, api_url)
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, timeout=120)


def deployment_id(api_url: str, name: str = "malt-run") -> str | None:
    body = {"deployments": {"name": {"any_": [name]}}, "limit": 1}
    found = httpx.post(f"{api_url}/deployments/filter", json=body, timeout=10).json()
    return found[0]["id"] if found else None


def latest_flow_run(api_url: str, flow_name: str = "malt-iteration") -> dict:
    body = {"flows": {"name": {"any_": [flow_name]}}, "sort": "START_TIME_DESC", "limit": 1}
    runs = httpx.post(f"{api_url}/flow_runs/filter", json=body, timeout=10).json()
    if not runs:
        raise RuntimeError(f"no {flow_name} flow run on {api_url}")
    return runs[0]


def table_artifact_id(api_url: str, flow_run_id: str) -> str | None:
    body = {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}, "type": {"any_": ["table"]}}}
    found = httpx.post(f"{api_url}/artifacts/filter", json=body, timeout=10).json()
    return found[0]["id"] if found else None


def screenshot(chromium: str, url: str, png: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}", url]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    if not png.exists() or png.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot for {url}")
    return png


def dump_dom(chromium: str, url: str) -> str:
    """The page's DOM after its scripts ran: lets a test check what the screenshot shows."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
    return done.stdout


def shoot_ui(chromium: str, api_url: str, out: Path) -> list[Path]:
    """The newest malt-iteration flow run page, and its table artifact page."""
    ui = api_url.removesuffix("/api")
    run = latest_flow_run(api_url)
    shots = [screenshot(chromium, f"{ui}/runs/flow-run/{run['id']}", out / "prefect-flow-run.png")]
    artifact = table_artifact_id(api_url, run["id"])
    if artifact:
        shots.append(
            screenshot(chromium, f"{ui}/artifacts/artifact/{artifact}", out / "prefect-table.png")
        )
    with contextlib.suppress(RuntimeError):  # a server without a malt_run: skip that page
        whole = latest_flow_run(api_url, "malt-run")
        url = f"{ui}/runs/flow-run/{whole['id']}?tab=Subflow+Runs"
        shots.append(screenshot(chromium, url, out / "prefect-malt-run-subflows.png"))
    deployment = deployment_id(api_url)
    if deployment:
        url = f"{ui}/deployments/deployment/{deployment}/run"
        shots.append(screenshot(chromium, url, out / "prefect-deployment-form.png"))
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNG files")
    parser.add_argument("--api-url", help="use this running Prefect API instead of a new one")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    chromium = ensure_chromium()
    if args.api_url:
        shots = shoot_ui(chromium, args.api_url.rstrip("/"), args.out)
    else:
        with tempfile.TemporaryDirectory(prefix="prefect-ui-shot-") as tmp:
            home, root = Path(tmp) / "prefect-home", Path(tmp) / "artifacts"
            with prefect_server(home, ui=True, log=Path(tmp) / "server.log") as api_url:
                run_dummy_iteration(api_url, root, home, "ui-demo")
                run_dummy_malt_run(api_url, root, home, "ui-demo-run")
                register_deployment(api_url, home)
                shots = shoot_ui(chromium, api_url, args.out)
    for shot in shots:
        print(shot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
