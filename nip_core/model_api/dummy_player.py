"""How the offline dummy plays a game: replies shaped like the protocols' verifier and prover
turns, from a stable hash of (seed, request seed, conversation, sample index).

Used by `DummyChatClient` (no server at all) and by the language-model server's dummy engine
(the HTTP path without a model), so both produce real trees and pairs. The randomness comes from
a stable hash, never Python's salted `hash` (nip §8.18).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string

FILL_IN_MARKER = "# <the missing part>"  # the fill-in verifier's prompt shows it
_DECISION_RE = re.compile(r"decision:\s*accept", re.IGNORECASE)
_REJECT_RE = re.compile(r"decision:\s*reject", re.IGNORECASE)
_HEADER_RE = re.compile(r"Question for ([A-Za-z0-9_]+):")
_MUST_DECIDE_RE = re.compile(  # nip's, our protocols' and the supervisor's "decide now" notes
    r"\bmust\b[^.\n]*\bdeci(?:de|sion)\b|\bno (?:more )?questions? (?:left|remaining)\b"
    r"|\bcannot ask any more questions\b|\bnow with your (?:decision|verdict)\b",
    re.IGNORECASE,
)


def _fill_in_reply(rng: random.Random, system: str, p_invalid: float) -> str:
    """A fill-in verifier's writing: a line of the shown solution with a word changed (so it
    lands nearer one version or the other), or, as an invalid reply, an empty code block."""
    if rng.random() < p_invalid:
        return "```python\n```"
    code = re.search(r"```python\n(.*?)```", system, re.DOTALL)
    lines = [line for line in (code.group(1) if code else "").splitlines() if line.strip()]
    line = rng.choice(lines) if lines else ""
    return f"```python\n{line} {_words(rng, 1).lower()}\n```"


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


def dummy_reply(
    messages: list[dict],
    *,
    seed: int,
    request_seed: int | None,
    index: int,
    invalid_probability: float,
    candidates: tuple[str, ...] | None = None,
) -> str:
    """The `index`-th sampled reply to `messages` (pure).

    Given `candidates`, the reply is one of them, drawn evenly. A fill-in verifier (its prompt
    shows a solution with a part cut out) writes a line of code.
    Verifier prompts get a decision (1/5 accept, 1/5 reject) or a question, one line per
    "Question for <Name>:" header; other prompts get "Answer: ...". A fraction
    `invalid_probability` of verifier replies is malformed so retry paths run; a trailing
    "you must decide" system message always gets a valid decision. Provers are always valid.
    """
    convo = [[m["role"], m["content"], m.get("name")] for m in messages]
    blob = json.dumps([seed, request_seed, convo, index], ensure_ascii=False).encode()
    rng = random.Random(int.from_bytes(hashlib.sha256(blob).digest(), "big"))
    if candidates:
        return rng.choice(candidates)
    system = messages[0]["content"] if messages[0].get("role") == "system" else ""
    if FILL_IN_MARKER in system:
        return _fill_in_reply(rng, system, invalid_probability)
    if not _is_verifier_prompt(system):
        return f"Answer: {_words(rng)}."
    headers = _question_headers(system)
    forced = _must_decide_now(messages)
    return _verifier_reply(rng, headers, forced, invalid_probability)
