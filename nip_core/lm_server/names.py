"""What names and paths the server accepts from a request: job suffixes, adapter names, and
adapter folders (its own state folder only, unless started with --allow-adapters-anywhere)."""

from __future__ import annotations

import re
from pathlib import Path

from nip_core.lm_server.engines.base import AdapterError

SAFE_SUFFIX = re.compile(r"[A-Za-z0-9._-]{0,64}")
# Served model names: our fine-tuned ones look like `ft:<base>:<suffix>:<job id>`.
SAFE_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,255}")


def suffix_ok(suffix: object) -> bool:
    """A fine-tune job's suffix: None, or at most 64 letters, digits, '.', '_' or '-'."""
    return suffix is None or (isinstance(suffix, str) and bool(SAFE_SUFFIX.fullmatch(suffix)))


def check_adapter_request(
    name: str, path: str, base_name: str, state_root: Path, allow_anywhere: bool
) -> None:
    """A hand-loaded adapter: a plain model name, and a folder inside the state folder."""
    if not SAFE_MODEL_NAME.fullmatch(name or "") or ".." in name:
        raise AdapterError(f"adapter name {name!r} must be letters, digits, '.', '_', ':' or '-'")
    if name == base_name:
        raise AdapterError(f"adapter name {name!r} clashes with the base model")
    if not allow_anywhere and not Path(path).resolve().is_relative_to(state_root.resolve()):
        raise AdapterError(
            f"adapter path {path!r} is outside the server's state folder "
            "(start the server with --allow-adapters-anywhere to load it)"
        )
