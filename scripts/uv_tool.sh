# Sourced by scripts/lock.sh and scripts/check_lock.sh: uv at one pinned version, installed once
# from PyPI into its own virtual environment under the user's cache; `uv` runs it.
UV_VERSION=0.13.9
uv_venv=${XDG_CACHE_HOME:-$HOME/.cache}/nip-malt/uv-$UV_VERSION
if [ ! -x "$uv_venv/bin/uv" ]; then
  "${PYTHON:-python3}" -m venv "$uv_venv"
  "$uv_venv/bin/python" -m pip install --quiet --isolated --index-url https://pypi.org/simple \
    "uv==$UV_VERSION"
fi
uv() { "$uv_venv/bin/uv" "$@"; }
