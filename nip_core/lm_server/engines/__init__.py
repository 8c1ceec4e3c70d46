"""Inference engines of the language-model server; `make_engine` picks one by name."""

from __future__ import annotations

from typing import Any

from nip_core.lm_server.engines.base import (
    AdapterError,
    ChatChoice,
    ChatRequest,
    InferenceEngine,
)

ENGINE_NAMES = ("dummy", "transformers", "vllm")

__all__ = [
    "ENGINE_NAMES",
    "AdapterError",
    "ChatChoice",
    "ChatRequest",
    "InferenceEngine",
    "make_engine",
]


def make_engine(name: str, model: str, **opts: Any) -> InferenceEngine:
    """Build the engine `name` serving `model`; heavy engines are imported only when chosen."""
    if name == "dummy":
        from nip_core.lm_server.engines.dummy import DummyEngine

        return DummyEngine(model, **opts)
    if name == "transformers":
        from nip_core.lm_server.engines.hf import TransformersEngine

        return TransformersEngine(model, **opts)
    if name == "vllm":
        from nip_core.lm_server.engines.vllm import VllmEngine

        return VllmEngine(model, **opts)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
