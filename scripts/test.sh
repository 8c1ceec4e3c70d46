#!/usr/bin/env bash
# The test command: set up, lint (ruff check + format check), then the pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
ruff check .
ruff format --check .
python -m pytest "$@"
