"""The call journal's promise after a run killed mid-rollout is resumed, checked on the dummy
backend's call log (one key per model call made, in order)."""

from __future__ import annotations

from collections import Counter


def assert_only_unjournaled_calls_repeat(
    before: list[str], calls: list[str], journaled: set[str]
) -> None:
    """No call journaled before the kill (`journaled`, checked non-empty and among the calls
    the killed process made, so the check is not vacuous) is made again after the resume;
    only a call killed between its answer and its journal entry reaching storage may be."""
    assert journaled and journaled <= set(before)  # the dummy logs the same keys
    assert len(calls) > len(before)
    again = {key for key, count in Counter(calls).items() if count > 1}
    assert not again & journaled, "a journaled model call was repeated after resume"
    assert again <= set(before) - journaled
