"""Which interaction protocols show what, by name: read by the parameters' rules and by the
data and agents that build each protocol's datapoints and replies. Pure constants."""

from __future__ import annotations

# The protocols whose datapoints are two solutions to one question (`nip_core.data.pairwise`).
PAIR_PROTOCOLS: tuple[str, ...] = ("pairwise", "fill_in", "fill_in_choice")
# The protocols whose verifier reply is drawn from a closed set of texts (our server's
# `candidates` extension) rather than decoded token by token.
CLOSED_REPLY_PROTOCOLS: tuple[str, ...] = ("fill_in_choice",)
