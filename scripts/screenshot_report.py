"""Screenshot a page (a run's report.html, or any URL) in headless Chromium.

    python scripts/screenshot_report.py artifacts/exp1/report.html --out report.png
    python scripts/screenshot_report.py artifacts/exp1 --out report.png   # builds the report first
    python scripts/screenshot_report.py http://127.0.0.1:4200/runs --out ui.png

Installs Debian's `chromium` and `chromium-driver` with apt-get when no Chromium is on PATH
(needs root, as in our containers). Chromium runs with a throw-away profile and every
background network feature off, so a screenshot of a report touches no network.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
QUIET_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def ensure_chromium() -> str:
    """The Chromium executable, installing the Debian packages when there is none."""
    found = find_chromium()
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError(
            "chromium is not installed; run: apt-get install -y chromium chromium-driver"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "chromium", "chromium-driver"], check=True, env=env)
    found = find_chromium()
    if not found:
        raise RuntimeError("apt-get installed chromium but no chromium executable is on PATH")
    return found


def page_url(target: str) -> str:
    """A URL for Chromium: URLs pass through, files become file:// URLs."""
    if "://" in target:
        return target
    path = Path(target).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no page to screenshot at {target}")
    return path.as_uri()


def screenshot(
    target: str,
    png: Path,
    width: int = 1400,
    height: int = 2400,
    chromium: str | None = None,
    timeout_s: float = 120.0,
) -> Path:
    """Render `target` (file or URL) at width x height and save a PNG of the viewport."""
    chromium = chromium or ensure_chromium()
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="nip-chromium-") as profile:
        command = [
            chromium,
            *QUIET_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--screenshot={png}",
            page_url(target),
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if not png.is_file() or png.stat().st_size == 0:
        raise RuntimeError(
            f"chromium wrote no screenshot (exit {result.returncode}): {result.stderr[-2000:]}"
        )
    return png


def report_page(target: str) -> str:
    """A run folder becomes its freshly built report.html; anything else is used as is."""
    if "://" in target or not Path(target).is_dir():
        return target
    run_dir = Path(target).resolve()
    repo = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-m", "flows.report", str(run_dir)], check=True, cwd=repo)
    return str(run_dir / "report.html")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target", help="report.html, a run folder, or a URL")
    parser.add_argument("--out", default="report.png", help="PNG to write (default report.png)")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=2400)
    args = parser.parse_args(argv)
    try:
        png = screenshot(report_page(args.target), Path(args.out), args.width, args.height)
    except (RuntimeError, FileNotFoundError, subprocess.SubprocessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"screenshot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
