"""The interface every inference engine of the language-model server implements.

The HTTP layer only talks to engines through `InferenceEngine`, so the vLLM, transformers and dummy
engines are interchangeable and the server can be tested without a GPU.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class ChatRequest:
    """One chat-completion request, already validated by the HTTP layer."""

    model: str
    messages: list[dict]
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    repetition_penalty: float | None = None


@dataclass(frozen=True)
class ChatChoice:
    """One sampled answer; `finish_reason` is "stop" or "length"."""

    text: str
    finish_reason: str


class AdapterError(ValueError):
    """A bad adapter path or name; the server answers 400/404 with this message."""


class InferenceEngine(typing.Protocol):
    """What the server needs from an engine: serve chats, swap adapters, yield the accelerator."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def models(self) -> list[str]:
        """The base model name followed by the names of the loaded adapters."""
        ...

    async def chat(self, request: ChatRequest) -> list[ChatChoice]: ...

    async def load_adapter(self, name: str, path: str) -> None: ...

    # Optional (ours): `async def score(model, conversations) -> list[(logprob, tokens)]`, the
    # log-likelihood of each conversation's last message; engines without it answer 501.

    async def unload_adapter(self, name: str) -> None: ...

    async def release_accelerator(self) -> None:
        """Free the accelerator before training (vLLM stops its server to free the GPU)."""
        ...

    async def reacquire_accelerator(self) -> None:
        """Take the accelerator back after training."""
        ...
