"""JSON Lines as the API's files hold them: one JSON value a line, a line ended by "\n" only.

`str.splitlines` also ends a line at U+2028, U+2029, NEL and other separators, which a JSON
string may hold raw (`json.dumps(..., ensure_ascii=False)` writes them so): a prover's reply
holding a U+2028 once split a DPO training row in two and failed the job. Every reader of our
JSONL files (training files, the call journal, job events, server restarts) splits here.
"""

from __future__ import annotations

from collections.abc import Iterator


def jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) of every line of `text` that is not blank."""
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield number, line
