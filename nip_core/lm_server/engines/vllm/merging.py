"""Merge mode's checkpoints: a LoRA adapter merged into the base weights, made once, in a child.

The merge runs `python -m nip_core.lm_server.merge_lora BASE ADAPTER OUT` (this environment:
peft) with its output appended to vLLM's log; a folder that holds a finished merge of the same
base and adapter (its marker matches) is reused, so a restarted server does not merge again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path

from nip_core.lm_server.engines.base import AdapterError
from nip_core.lm_server.engines.vllm.process import log_tail
from nip_core.lm_server.merge_lora import is_merged

_log = logging.getLogger(__name__)


def merged_folder_name(name: str, path: str) -> str:
    """A folder name for the merge of adapter `path` served as `name` (readable, unique)."""
    digest = hashlib.sha256(f"{name}\0{path}".encode()).hexdigest()[:16]
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)[-80:]}-{digest}"


def is_full_checkpoint(path: str) -> bool:
    """A full fine-tuned checkpoint (served as it is) rather than a LoRA adapter."""
    root = Path(path)
    return (root / "config.json").is_file() and not (root / "adapter_config.json").exists()


async def merged_checkpoint(
    merge_command: Sequence[str],
    base: str,
    name: str,
    adapter: str,
    merge_dir: Path,
    log_path: Path,
    timeout: float,
) -> str:
    """The merged checkpoint of `adapter` on `base` (merged now unless it exists)."""
    output = merge_dir / merged_folder_name(name, adapter)
    if is_merged(output, base, adapter):
        return str(output)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("ab") as log:
        log.write(f"\n==== nip: merging {adapter} into {output}\n".encode())
        log.flush()
        offset = log.tell()
        process = await asyncio.create_subprocess_exec(
            *merge_command,
            base,
            adapter,
            str(output),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        try:
            code = await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            code = None
    if code != 0 or not is_merged(output, base, adapter):
        raise AdapterError(
            f"could not merge adapter {name!r} from {adapter} into the base model "
            f"(exit code {code}); {log_tail(log_path, offset)}"
        )
    _log.info("vLLM: merged %s in %.1f s", name, time.monotonic() - started)
    return str(output)
