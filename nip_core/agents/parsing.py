"""Turn a model's raw text into a verdict or per-channel messages.

Decision parsing is deliberately narrower than a substring test (the reference treats any text
containing "decision: accept" as a verdict, so a prover quoting it loses its message and a
verifier asking "what is your decision:" is retried). Here a verdict must be *stated*: either a
labelled line ("Decision: accept", "**Verdict** - Reject.") or a first-person statement ("I accept
the solution"). Questions never count, and a text stating both verdicts counts as none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from nip_core.data.pairwise import (
    datapoint_disputed_part,
    nearer_version,
    version_text,
    writes_disputed_part,
)
from nip_core.episode import ACCEPT, REJECT, Datapoint
from nip_core.protocols import Protocol, active_channels, verifier_can_decide

Verdict = Literal["accept", "reject"]

_VERDICT_VALUES: dict[str, int] = {"accept": ACCEPT, "reject": REJECT}

# Markdown emphasis, code ticks, quotes and heading markers carry no meaning for a verdict.
_MARKUP = re.compile(r"[*_`#>\"“”]+")
_VERDICT_WORD = r"(accept|reject)(?:s|ed|ing|ance|ion)?\b"
# "Decision: accept", "final decision - REJECT", "my verdict is to accept", "decision = accepted"
_LABELLED = re.compile(
    r"\b(?:final\s+|my\s+|the\s+)*(?:decision|verdict)\s*"
    r"(?:[:=\-–—]|\bis\b)\s*(?:[:\-–—]\s*)?(?:to\s+|that\s+i\s+|i\s+)?(?:will\s+)?" + _VERDICT_WORD
)
# "I accept the solution", "I will reject it", "I have decided to accept", "I'm going to reject".
_FIRST_PERSON = re.compile(
    r"\b(?:i|we)(?:'m|\s+am|'ll|\s+will|\s+must|\s+have|'ve|\s+hereby|\s+therefore|\s+thus|"
    r"\s+now|\s+(?:have\s+)?decided|\s+decide|\s+choose|\s+going)*\s+"
    r"(?:to\s+)?" + _VERDICT_WORD
)
# A label that promises a verdict ("Decision:" at the start of a line) even if none follows.
_LABEL_ATTEMPT = re.compile(r"(?:^|\n)\s*(?:final\s+|my\s+)?(?:decision|verdict)\s*[:=\-–—]")
_NEGATION = re.compile(r"\b(?:not|never|cannot|can't|won't|don't|wouldn't|shouldn't|no)\s+$")
_ALTERNATIVE = re.compile(r"\s*(?:or|/|and|nor)\s*" + _VERDICT_WORD)
_QUESTION_LINE = re.compile(r"^\s*question\b")
# A label alone on its line ("## Decision" / "Decision:") followed by the verdict on the next.
_LABEL_LINE_BREAK = re.compile(r"\b(decision|verdict)[ \t]*(:?)[ \t]*\n\s*")
_BARE_VERDICT = re.compile(r"^\W*" + _VERDICT_WORD + r"\W*$")


def _clean(text: str) -> str:
    lowered = _MARKUP.sub("", text).lower()
    return _LABEL_LINE_BREAK.sub(r"\1: ", lowered)


def _statement_spans(text: str) -> list[str]:
    """Sentences that assert something: questions and "Question for ..." lines are dropped."""
    kept: list[str] = []
    for line in text.splitlines():
        if _QUESTION_LINE.match(line):
            continue
        for sentence in re.split(r"(?<=[.!?;])\s+", line):
            if sentence.strip() and not sentence.rstrip().endswith("?"):
                kept.append(sentence)
    return kept


def _verdicts_in(sentence: str) -> set[str]:
    found: set[str] = set()
    for pattern in (_LABELLED, _FIRST_PERSON):
        for match in pattern.finditer(sentence):
            if _NEGATION.search(sentence[: match.start(1)]):
                continue
            found.add(match.group(1))
            alternative = _ALTERNATIVE.match(sentence, match.end())
            if pattern is _LABELLED and alternative:
                found.add(alternative.group(1))  # "Decision: accept or reject" names both
    return found


def stated_verdicts(text: str) -> set[str]:
    """Every verdict ("accept"/"reject") the text asserts; empty if it asserts none."""
    cleaned = _clean(text)
    bare = _BARE_VERDICT.match(cleaned)
    if bare:
        return {bare.group(1)}
    found: set[str] = set()
    for sentence in _statement_spans(cleaned):
        found |= _verdicts_in(sentence)
    return found


def parse_decision(text: str) -> Verdict | None:
    """The single verdict stated in `text`, or None if it states none or both."""
    verdicts = stated_verdicts(text)
    if len(verdicts) != 1:
        return None
    return "accept" if "accept" in verdicts else "reject"


def looks_like_decision_attempt(text: str) -> bool:
    """True if the text tries to decide (a "Decision:" label or conflicting verdicts)."""
    cleaned = _clean(text)
    return len(stated_verdicts(text)) > 1 or bool(_LABEL_ATTEMPT.search(cleaned))


def decision_value(verdict: Verdict) -> int:
    """`ACCEPT`/`REJECT` for a parsed verdict."""
    return _VERDICT_VALUES[verdict]


class InvalidResponse(ValueError):
    """A completion that cannot be used as this agent's move; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ParsedResponse:
    """An agent's move: messages per channel, or a verdict (then `messages` is empty)."""

    messages: dict[str, str] = field(default_factory=dict)
    decision: int | None = None


def split_by_headers(text: str, headers: dict[str, str]) -> dict[str, str]:
    """Split `text` at the first occurrence of each channel's header (case-insensitive).

    Each part runs from its header (kept, so the recipient sees who was addressed) to the next
    header. Text before the first header is dropped. Every header must occur and every part
    must say something beyond its header.
    """
    lowered = text.lower()
    positions: dict[str, int] = {}
    missing: list[str] = []
    for channel, header in headers.items():
        index = lowered.find(header.lower())
        if index < 0:
            missing.append(header)
        else:
            positions[channel] = index
    if missing:
        raise InvalidResponse(
            f"response lacks the header(s) {missing}; each of {list(headers.values())} is required"
        )
    ordered = sorted(positions.items(), key=lambda item: item[1])
    if len({pos for _, pos in ordered}) != len(ordered):
        raise InvalidResponse(f"headers {list(headers.values())} overlap in the response")
    parts: dict[str, str] = {}
    for i, (channel, start) in enumerate(ordered):
        end = ordered[i + 1][1] if i + 1 < len(ordered) else len(text)
        part = text[start:end].strip()
        if not part[len(headers[channel]) :].strip(" \t\n*_`:"):
            raise InvalidResponse(f"the part after header {headers[channel]!r} is empty")
        parts[channel] = part
    return parts


def written_verdict(text: str, datapoint: Datapoint | None) -> int:
    """The fill-in verifier's verdict: ACCEPT if the part it wrote is nearer Solution A's
    version, REJECT if nearer Solution B's; raises `InvalidResponse` if it is as near to both."""
    if datapoint is None:
        raise ValueError("a fill-in verdict needs the datapoint's two solutions")
    part = datapoint_disputed_part(datapoint)
    verdict = nearer_version(text, version_text(part.first), version_text(part.second))
    if verdict is None:
        raise InvalidResponse(
            "the written part is as near to one version of the missing part as to the other; "
            "write the missing lines of code"
        )
    return ACCEPT if verdict == 1 else REJECT


def parse_response(
    protocol: Protocol,
    agent_name: str,
    round: int,
    episode_seed: int,
    text: str,
    datapoint: Datapoint | None = None,
) -> ParsedResponse:
    """The move `text` makes for `agent_name` in `round`; raises `InvalidResponse` if unusable.

    Only a verifier allowed to decide this round can decide (or, with the protocol's
    `early_decision_ends_episode`, end the episode by a verdict too early); a prover's text is
    always just its message, even if it quotes "Decision: accept". In the fill-in protocol the
    verifier's text is code, and `datapoint` (its two solutions) turns it into a verdict.
    """
    spec = protocol.agent(agent_name)
    if not text or not text.strip():
        raise InvalidResponse("the response is empty")
    if writes_disputed_part(protocol.name) and spec.is_verifier:
        return ParsedResponse(messages={}, decision=written_verdict(text, datapoint))
    can_decide = spec.is_verifier and verifier_can_decide(protocol, round, episode_seed)
    if can_decide or (spec.is_verifier and protocol.early_decision_ends_episode):
        verdict = parse_decision(text)
        if verdict is not None:  # too early, `step_outcome` ends the episode undecided
            return ParsedResponse(messages={}, decision=decision_value(verdict))
        if can_decide and looks_like_decision_attempt(text):
            raise InvalidResponse(
                "the response tries to decide but states no single verdict; write exactly "
                '"Decision: accept" or "Decision: reject"'
            )
    channels = active_channels(protocol, agent_name, round, episode_seed)
    if not channels:
        raise ValueError(f"agent {agent_name!r} does not act in round {round} of {protocol.name!r}")
    if len(channels) == 1:
        return ParsedResponse(messages={channels[0]: text.strip()})
    headers = spec.response_headers or {}
    unheaded = [c for c in channels if c not in headers]
    if unheaded:
        raise ValueError(f"agent {agent_name!r} writes to {unheaded} but has no header for them")
    return ParsedResponse(messages=split_by_headers(text, {c: headers[c] for c in channels}))
