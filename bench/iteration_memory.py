"""Peak resident memory of one default iteration (flow + language-model server + LoRA DPO job).

    python bench/iteration_memory.py [extra flows.malt_iteration arguments]

Runs `python -m flows.malt_iteration` on the embedded default configuration in a fresh run folder
and samples the resident memory of the whole process tree (the flow, the self-hosted server it
starts, the training child) every 0.1 s. The budget is 4 GiB on CPU; the last line prints the
peak divided by that budget (target <= 1.0).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

import psutil

BUDGET_GIB = 4.0


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for proc in [process, *process.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def main() -> None:
    root = tempfile.mkdtemp(prefix="nip-memory-")
    command = [
        sys.executable,
        "-m",
        "flows.malt_iteration",
        "--run-name",
        "memory",
        "--artifacts-root",
        root,
        *sys.argv[1:],
    ]
    start = time.perf_counter()
    child = subprocess.Popen(command)
    process = psutil.Process(child.pid)
    peak = 0
    while child.poll() is None:
        peak = max(peak, tree_rss(process))
        time.sleep(0.1)
    wall = time.perf_counter() - start
    if child.returncode != 0:
        sys.exit(f"the iteration failed with exit code {child.returncode}")
    peak_gib = peak / 2**30
    print(f"wall time: {wall:.1f} s, peak resident memory of the process tree: {peak_gib:.2f} GiB")
    print(f"ratio peak/budget ({BUDGET_GIB} GiB): {peak_gib / BUDGET_GIB:.3f}")


if __name__ == "__main__":
    main()
