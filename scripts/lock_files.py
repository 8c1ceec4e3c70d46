"""Post-process uv's requirements output for scripts/lock.sh.

    python scripts/lock_files.py split LOCK CUDA_LOCK      # move the CUDA runtime to its own file
    python scripts/lock_files.py add-hashes LOCK torch WHEEL...   # add local wheels' hashes

`split`: PyPI's Linux build of torch pulls its CUDA runtime (nvidia-*, cuda-*, triton); on a
machine that installs the CPU build of torch they are dead weight of several GB, so they live in
a file of their own, which scripts/setup.sh installs only where it installed a CUDA build.
`add-hashes`: the CPU build of torch (`torch-2.13.0+cpu-...whl`) is not on PyPI; pip takes it
from a local wheel folder or PyTorch's CPU index when it finds it there (its version, 2.13.0+cpu,
satisfies `torch==2.13.0` and sorts above it), so its hash joins the requirement's.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

CUDA_RUNTIME = re.compile(r"^(nvidia-[\w.-]+|cuda-[\w.-]+|triton)==")
REQUIREMENT = re.compile(r"^[A-Za-z0-9][\w.-]*==")


def blocks(text: str) -> tuple[list[str], list[list[str]]]:
    """(header lines, one block of lines per requirement: the requirement, its hashes and its
    `# via` comments)."""
    header: list[str] = []
    found: list[list[str]] = []
    for line in text.splitlines():
        if REQUIREMENT.match(line):
            found.append([line])
        elif found:
            found[-1].append(line)
        else:
            header.append(line)
    return header, found


def split(lock: Path, cuda_lock: Path) -> None:
    header, found = blocks(lock.read_text())
    kept = [b for b in found if not CUDA_RUNTIME.match(b[0])]
    moved = [b for b in found if CUDA_RUNTIME.match(b[0])]
    lock.write_text("\n".join(header + [line for b in kept for line in b]) + "\n")
    note = [
        "# The CUDA runtime of PyPI's Linux build of torch: scripts/setup.sh installs it only",
        "# where it installed that build (not the CPU build). Written by scripts/lock.sh.",
    ]
    cuda_lock.write_text("\n".join(note + [line for b in moved for line in b]) + "\n")


def add_hashes(lock: Path, name: str, wheels: list[Path]) -> None:
    header, found = blocks(lock.read_text())
    hashes = [hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels]
    for block in found:
        if block[0].split("==")[0].lower() != name.lower():
            continue
        known = {line.strip() for line in block}
        extra = [f"    --hash=sha256:{h}" for h in hashes if f"--hash=sha256:{h}" not in known]
        last_hash = max(i for i, line in enumerate(block) if "--hash=" in line)
        if extra:
            block[last_hash] = block[last_hash].rstrip(" \\") + " \\"
            for i, line in enumerate(extra):
                block.insert(last_hash + 1 + i, line + (" \\" if i < len(extra) - 1 else ""))
    lock.write_text("\n".join(header + [line for b in found for line in b]) + "\n")


def main(argv: list[str]) -> None:
    command, *rest = argv
    if command == "split":
        split(Path(rest[0]), Path(rest[1]))
    elif command == "add-hashes":
        add_hashes(Path(rest[0]), rest[1], [Path(w) for w in rest[2:]])
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
