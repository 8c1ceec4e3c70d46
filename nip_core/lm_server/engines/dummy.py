"""A deterministic engine with canned answers, for fast tests of the HTTP layer without a model.

Answers depend only on (model, messages, seed, sample index), so tests can assert on them; an
adapter only needs to be a directory (the fake trainer writes a marker file into it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from nip_core.lm_server.engines.base import AdapterError, ChatChoice, ChatRequest
from nip_core.model_api.dummy_player import dummy_reply


class DummyEngine:
    """Canned, reproducible chat answers; adapters are tracked by name only."""

    name = "dummy"

    def __init__(self, model: str, **_: object) -> None:
        self.model = model
        self._adapters: dict[str, str] = {}
        self.accelerator_held = True

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def models(self) -> list[str]:
        return [self.model, *self._adapters]

    async def chat(self, request: ChatRequest) -> list[ChatChoice]:
        return [_canned(request, index) for index in range(request.n)]

    async def score(self, model: str, conversations: list[list[dict]]) -> list[tuple[float, int]]:
        """A reproducible stand-in: -1 to -2 nats per word, from a hash of model and text."""
        if model not in self.models():
            raise AdapterError(f"model {model!r} is not loaded")
        results = []
        for conversation in conversations:
            words = len(conversation[-1]["content"].split())
            key = json.dumps([model, conversation]).encode()
            per_word = 1.0 + int(hashlib.sha256(key).hexdigest()[:4], 16) / 0xFFFF
            results.append((-per_word * words, words))
        return results

    async def load_adapter(self, name: str, path: str) -> None:
        if not Path(path).is_dir():
            raise AdapterError(f"adapter path {path!r} is not a directory")
        if name == self.model:
            raise AdapterError(f"adapter name {name!r} clashes with the base model")
        self._adapters[name] = path

    async def unload_adapter(self, name: str) -> None:
        if self._adapters.pop(name, None) is None:
            raise AdapterError(f"no adapter named {name!r} is loaded")

    async def release_accelerator(self) -> None:
        self.accelerator_held = False

    async def reacquire_accelerator(self) -> None:
        self.accelerator_held = True


def _canned(request: ChatRequest, index: int) -> ChatChoice:
    """A short answer derived from a hash; sampling (temperature > 0) varies it per index."""
    sampled = request.temperature is None or request.temperature > 0
    if request.messages and request.messages[0].get("role") == "system":
        # A game prompt: answer like the pipeline's offline dummy backend (questions, answers,
        # verdicts), so flows run against this server produce real trees and pairs.
        text = dummy_reply(
            request.messages,
            seed=0,
            request_seed=request.seed,
            index=index if sampled else 0,
            invalid_probability=0.0,
        )
        return ChatChoice(text, "stop")
    key = json.dumps([request.model, request.messages, request.seed, index if sampled else 0])
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    text = f"Dummy answer {digest} from {request.model}."
    if request.max_tokens is not None and request.max_tokens < len(text.split()):
        return ChatChoice(" ".join(text.split()[: request.max_tokens]), "length")
    return ChatChoice(text, "stop")
