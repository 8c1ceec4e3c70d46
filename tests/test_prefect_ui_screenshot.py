"""The documented UI screenshot script: real server, one dummy iteration, headless Chromium.

pytest tests/test_prefect_ui_screenshot.py      (skipped when chromium is not installed)
"""

import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_prefect_server import shots

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed"),
]


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", header[16:24])


def test_script_saves_flow_run_and_table_screenshots(tmp_path):
    done = subprocess.run(
        [sys.executable, "scripts/screenshot_prefect_ui.py", "--out", str(tmp_path / "shots")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [Path(line) for line in done.stdout.splitlines() if line.endswith(".png")]
    names = {p.name for p in printed}
    assert names == {
        "prefect-flow-run.png",
        "prefect-table.png",
        "prefect-malt-run-subflows.png",
        "prefect-deployment-form.png",
    }
    for png in printed:
        assert png_size(png) == (1400, 1000)
        assert png.stat().st_size > 10_000  # a rendered page, not a blank canvas


def test_flow_run_page_renders_the_completed_run(tmp_path):
    """What the screenshot shows, checked through the DOM Chromium rendered."""
    home, root = tmp_path / "home", tmp_path / "artifacts"
    chromium = shutil.which("chromium")
    with shots.prefect_server(home, ui=True) as api:
        shots.run_dummy_iteration(api, root, home, "dom-check")
        run = shots.latest_flow_run(api)
        ui = api.removesuffix("/api")
        page = shots.dump_dom(chromium, f"{ui}/runs/flow-run/{run['id']}")
        table = shots.dump_dom(
            chromium, f"{ui}/artifacts/artifact/{shots.table_artifact_id(api, run['id'])}"
        )
    assert run["name"] in page and "malt-iteration" in page
    assert "Completed" in page and re.search(r"\d+\s*Task runs", page)  # (graph is a canvas)
    assert "Can't connect" not in page
    assert "dom-check-iteration-table" in table and "verifier" in table
