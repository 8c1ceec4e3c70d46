#!/usr/bin/env bash
# The main job: set up, then run one MALT iteration on the embedded default configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
exec python -m flows.malt_iteration "$@"
