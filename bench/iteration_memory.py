"""Peak resident memory of one default iteration (flow + language-model server + LoRA DPO job).

    python bench/iteration_memory.py [extra flows.malt_iteration arguments]
    NIP_LM_SERVER_ENGINE=vllm python bench/iteration_memory.py    # served by vLLM (on CPU)

Runs `python -m flows.malt_iteration` on the embedded default configuration in a fresh run folder
and samples the resident memory of the whole process tree (the flow, the self-hosted server it
starts, the training child) every 0.1 s. The budget is 4 GiB on CPU; the last line prints the
peak divided by that budget (target <= 1.0).

Two sums are taken at each sample. RSS counts a page once per process that maps it, so the three
Python processes' shared libraries (libtorch alone is hundreds of MiB) and the page cache of the
model file they all read are counted up to three times. PSS (Linux `smaps_rollup`) splits each
shared page between the processes that map it, so its sum is the memory the tree really holds;
the budget is checked against PSS, and the RSS sum is printed as an upper bound. The tree's
composition at its peak shows where the memory goes.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

import psutil

BUDGET_GIB = 4.0
GIB = 2**30


def role(proc: psutil.Process) -> str:
    """A short name for a process of the tree, from its command line."""
    try:
        line = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    for marker, name in (
        ("train_job", "training child"),
        ("merge_lora", "LoRA merge child"),
        ("vllm.entrypoints", "vLLM API server"),
        ("VLLM::", "vLLM engine core and worker"),
        ("lm_server", "language-model server"),
        ("prefect.server", "Prefect server"),
        ("flows.malt_iteration", "flow"),
    ):
        if marker in line:
            return name
    return proc.name()


def sample(process: psutil.Process) -> dict[str, tuple[int, int]]:
    """(RSS, PSS) of each process of the tree now, by role."""
    now: dict[str, tuple[int, int]] = {}
    for proc in [process, *process.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        rss, pss = now.get(role(proc), (0, 0))
        now[role(proc)] = (rss + info.rss, pss + info.pss)
    return now


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
    peak_rss = peak_pss = 0
    at_peak: dict[str, tuple[int, int]] = {}
    while child.poll() is None:
        now = sample(process)
        rss, pss = sum(r for r, _ in now.values()), sum(p for _, p in now.values())
        peak_rss = max(peak_rss, rss)
        if pss > peak_pss:
            peak_pss, at_peak = pss, now
        time.sleep(0.1)
    wall = time.perf_counter() - start
    if child.returncode != 0:
        sys.exit(f"the iteration failed with exit code {child.returncode}")
    print("at the peak:")
    for name, (rss, pss) in sorted(at_peak.items()):
        print(f"  {name}: RSS {rss / GIB:.2f} GiB, PSS {pss / GIB:.2f} GiB")
    print(f"wall time: {wall:.1f} s")
    print(f"peak RSS sum of the tree (shared pages counted per process): {peak_rss / GIB:.2f} GiB")
    print(f"peak PSS sum of the tree (resident memory it holds): {peak_pss / GIB:.2f} GiB")
    print(f"ratio peak/budget ({BUDGET_GIB} GiB): {peak_pss / GIB / BUDGET_GIB:.3f}")


if __name__ == "__main__":
    main()
