"""An offline `ChatClient` for tests and the no-network default: replies from a stable hash.

Replies are shaped like the verifier and prover replies the protocols expect. The randomness
comes from a stable hash, never Python's salted `hash` (nip §8.18).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import string

from nip_core.agents.chat_client import SamplingParams, check_request, request_digest

_DECISION_RE = re.compile(r"decision:\s*accept", re.IGNORECASE)
_REJECT_RE = re.compile(r"decision:\s*reject", re.IGNORECASE)
_HEADER_RE = re.compile(r"Question for ([A-Za-z0-9_]+):")
_MUST_DECIDE_RE = re.compile(  # nip's, our protocols' and the supervisor's "decide now" notes
    r"\bmust\b[^.\n]*\bdeci(?:de|sion)\b|\bno (?:more )?questions? (?:left|remaining)\b"
    r"|\bcannot ask any more questions\b|\bnow with your (?:decision|verdict)\b",
    re.IGNORECASE,
)


def _is_verifier_prompt(system: str) -> bool:
    """The verifier prompt is the one that tells the model how to write both decisions."""
    return bool(_DECISION_RE.search(system) and _REJECT_RE.search(system))


def _question_headers(system: str) -> list[str]:
    """Distinct "Question for <Name>:" headers named by the system prompt, in order."""
    return list(dict.fromkeys(f"Question for {name}:" for name in _HEADER_RE.findall(system)))


def _must_decide_now(messages: list[dict]) -> bool:
    """True when the trailing message is a system (or supervisor) note forcing a decision."""
    last = messages[-1]
    forced_role = last.get("role") == "system" or last.get("name") == "Supervisor"
    return len(messages) > 1 and forced_role and bool(_MUST_DECIDE_RE.search(last["content"]))


def _words(rng: random.Random, count: int = 6) -> str:
    words = [
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8))) for _ in range(count)
    ]
    return " ".join(words).capitalize()


def _verifier_reply(rng: random.Random, headers: list[str], forced: bool, p_invalid: float) -> str:
    if forced:
        return "Decision: accept" if rng.random() < 0.5 else "Decision: reject"
    if rng.random() < p_invalid:
        if len(headers) > 1:  # a question that misses one of the required headers
            return f"{headers[0]} {_words(rng)}?"
        return "Decision: maybe"
    u = rng.random()
    if u < 0.2:
        return "Decision: accept"
    if u < 0.4:
        return "Decision: reject"
    lines = [f"{header} {_words(rng)}?" for header in headers] or [f"Question: {_words(rng)}?"]
    return "\n".join(lines)


class DummyChatClient:
    """Offline `ChatClient` whose replies depend only on (seed, sampling.seed, messages, index).

    Verifier prompts get a decision (1/5 accept, 1/5 reject) or a question, one line per
    "Question for <Name>:" header; other prompts get "Answer: ...". A fraction
    `invalid_probability` of verifier replies is malformed so retry paths run; a trailing
    "you must decide" system message always gets a valid decision. Provers are always valid.
    """

    def __init__(
        self, seed: int = 0, *, latency: float = 0.0, invalid_probability: float = 0.1
    ) -> None:
        if latency < 0:
            raise ValueError(f"latency must be >= 0, got {latency}")
        if not 0.0 <= invalid_probability <= 1.0:
            raise ValueError(f"invalid_probability must be in [0, 1], got {invalid_probability}")
        self.seed, self.latency, self.invalid_probability = seed, latency, invalid_probability
        self.calls = 0
        self.call_keys: list[str] = []
        self.call_log: str | None = None

    def _rng(self, messages: list[dict], sampling: SamplingParams, index: int) -> random.Random:
        convo = [[m["role"], m["content"], m.get("name")] for m in messages]
        blob = json.dumps([self.seed, sampling.seed, convo, index], ensure_ascii=False).encode()
        return random.Random(int.from_bytes(hashlib.sha256(blob).digest(), "big"))

    def reply(self, messages: list[dict], sampling: SamplingParams, index: int) -> str:
        """The `index`-th sampled reply to `messages` (pure; no counters touched)."""
        rng = self._rng(messages, sampling, index)
        system = messages[0]["content"] if messages[0].get("role") == "system" else ""
        if not _is_verifier_prompt(system):
            return f"Answer: {_words(rng)}."
        headers = _question_headers(system)
        forced = _must_decide_now(messages)
        return _verifier_reply(rng, headers, forced, self.invalid_probability)

    async def complete(
        self, messages: list[dict], model: str, n: int, sampling: SamplingParams
    ) -> list[str]:
        check_request(messages, model, n, sampling)
        if self.latency:
            await asyncio.sleep(self.latency)
        texts = [self.reply(messages, sampling, i) for i in range(n)]
        self.calls += 1
        key = request_digest(messages, model, n, sampling)
        self.call_keys.append(key)
        if self.call_log is not None:  # cross-process record, for resume tests
            with open(self.call_log, "a", encoding="utf-8") as f:
                f.write(key + "\n")
        return texts
