"""Sample an agent's responses and turn them into moves, re-sampling the invalid ones.

All `n` samples come from one client call; only the invalid ones are asked for again, in one
call per attempt with a seed derived from (seed, attempt). A sample still invalid after
`num_invalid_generation_retries` attempts becomes a failure with *no* channel messages: the
reference wrote "" on every channel, which collided with other agents' messages (nip §8.17).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from nip_core.agents.clients import ChatClient, SamplingParams
from nip_core.agents.parsing import InvalidResponse, ParsedResponse, parse_response
from nip_core.agents.prompts import verdict_reply
from nip_core.data.pairwise import chooses_disputed_part
from nip_core.episode import ACCEPT, REJECT, Datapoint
from nip_core.parameters.agents import PureTextAgentParameters
from nip_core.protocols import Protocol, verifier_can_decide
from nip_core.seeding import stable_int

_SHOWN_CHARS = 300  # how much of an invalid text a failure message quotes


@dataclass(frozen=True)
class AgentResponse:
    """One sampled move: the raw text, its messages or verdict, and how it was obtained.

    `retries` counts re-samples spent on this sample; `failure` is set (and `messages` empty,
    `decision` None) when every attempt was invalid. `token_limit` would flag a truncated
    completion; the `ChatClient` interface returns plain texts, so it is False for now.
    """

    raw: str
    messages: dict[str, str] = field(default_factory=dict)
    decision: int | None = None
    retries: int = 0
    failure: str | None = None
    token_limit: bool = False


def sampling_params(agent_params: PureTextAgentParameters, seed: int | None) -> SamplingParams:
    """The agent's sampling settings for one call."""
    return SamplingParams(
        temperature=agent_params.temperature,
        top_p=agent_params.top_p,
        max_tokens=agent_params.effective_max_tokens,
        seed=seed,
        repetition_penalty=agent_params.repetition_penalty,
    )


def attempt_seed(seed: int, attempt: int) -> int:
    """The call seed for attempt `attempt` (0 = first call): fresh, but reproducible."""
    return seed if attempt == 0 else stable_int("invalid-retry", seed, attempt, bits=31)


def _try_parse(
    protocol: Protocol,
    agent_name: str,
    round: int,
    episode_seed: int,
    text: str,
    datapoint: Datapoint | None,
) -> ParsedResponse | InvalidResponse:
    try:
        return parse_response(protocol, agent_name, round, episode_seed, text, datapoint)
    except InvalidResponse as error:
        return error


def _failure_text(retries: int, error: InvalidResponse, text: str) -> str:
    shown = text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."
    return f"invalid response after {retries} retries: {error.reason}; last text: {shown!r}"


async def _sample(
    client: ChatClient, chat: list[dict], model: str, n: int, sampling: SamplingParams
) -> list[str]:
    texts = await client.complete(chat, model, n, sampling)
    if len(texts) != n:
        raise RuntimeError(f"model client returned {len(texts)} completions, expected {n}")
    if sampling.candidates is not None and not set(texts) <= set(sampling.candidates):
        raise RuntimeError(
            f"model {model!r} answered outside the candidates it was given: its provider "
            "ignores `candidates` (only our self-hosted server and the dummy API draw from them)"
        )
    return list(texts)


def reply_candidates(
    protocol: Protocol, agent_name: str, datapoint: Datapoint | None
) -> tuple[str, ...] | None:
    """The texts the agent's reply must be one of, where its protocol closes the reply: the
    choosing fill-in verifier writes Solution A's or Solution B's version of the missing part."""
    if not (chooses_disputed_part(protocol.name) and protocol.agent(agent_name).is_verifier):
        return None
    if datapoint is None:
        raise ValueError(f"the {protocol.name!r} verifier's reply needs its datapoint")
    return tuple(verdict_reply(protocol, datapoint, verdict) for verdict in (ACCEPT, REJECT))


async def generate_responses(
    client: ChatClient,
    protocol: Protocol,
    agent_name: str,
    agent_params: PureTextAgentParameters,
    model: str,
    chat: list[dict],
    n: int,
    round: int,
    episode_seed: int,
    seed: int,
    datapoint: Datapoint | None = None,
    early_verdict_retries: int = 0,
) -> list[AgentResponse]:
    """`n` parsed responses of `agent_name` to `chat`, in sample order.

    Client errors (network, rate limits) propagate; only parse failures are retried here.
    `datapoint` is needed where a verdict is read against the solutions (the fill-in protocol).
    `early_verdict_retries` re-samples a verifier's verdict given before it may decide (under
    `early_decision_ends_episode`) up to that many times, keeping the first fresh sample that is
    a valid move and no verdict; one still early after them stands, and ends the episode.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    max_retries = agent_params.num_invalid_generation_retries
    if max_retries < 0:
        raise ValueError(f"num_invalid_generation_retries must be >= 0, got {max_retries}")

    def parse(text: str) -> ParsedResponse | InvalidResponse:
        return _try_parse(protocol, agent_name, round, episode_seed, text, datapoint)

    def early(result: ParsedResponse | InvalidResponse) -> bool:
        return is_early_verdict(protocol, round, episode_seed, result)

    candidates = reply_candidates(protocol, agent_name, datapoint)
    sample = _Sampler(client, chat, model, agent_params, candidates)
    texts = await sample(n, seed)
    results = [parse(text) for text in texts]
    retries = [0] * n
    for attempt in range(1, max_retries + 1):
        pending = [i for i, result in enumerate(results) if isinstance(result, InvalidResponse)]
        if not pending:
            break
        fresh = await sample(len(pending), attempt_seed(seed, attempt))
        for index, text in zip(pending, fresh, strict=True):
            texts[index] = text
            retries[index] += 1
            results[index] = parse(text)
    await _replace_early_verdicts(
        sample, parse, early, seed, early_verdict_retries, texts, results, retries
    )
    return [_response(texts[i], results[i], retries[i]) for i in range(n)]


@dataclass(frozen=True)
class _Sampler:
    """One chat's sampling call with its fixed settings; `seed` and `n` vary per attempt."""

    client: ChatClient
    chat: list[dict]
    model: str
    agent_params: PureTextAgentParameters
    candidates: tuple[str, ...] | None

    async def __call__(self, n: int, seed: int) -> list[str]:
        sampling = replace(sampling_params(self.agent_params, seed), candidates=self.candidates)
        return await _sample(self.client, self.chat, self.model, n, sampling)


async def _replace_early_verdicts(
    sample: _Sampler,
    parse: Callable[[str], ParsedResponse | InvalidResponse],
    early: Callable[[ParsedResponse | InvalidResponse], bool],
    seed: int,
    attempts: int,
    texts: list[str],
    results: list[ParsedResponse | InvalidResponse],
    retries: list[int],
) -> None:
    """Re-sample the early verdicts among `results` in place, up to `attempts` times each: the
    first fresh sample that parses and is no early verdict replaces it."""
    for attempt in range(1, attempts + 1):
        pending = [i for i, result in enumerate(results) if early(result)]
        if not pending:
            return
        fresh = await sample(
            len(pending), stable_int("early-verdict-retry", seed, attempt, bits=31)
        )
        for index, text in zip(pending, fresh, strict=True):
            retries[index] += 1
            result = parse(text)
            if isinstance(result, ParsedResponse) and not early(result):
                texts[index], results[index] = text, result


def is_early_verdict(
    protocol: Protocol, round: int, episode_seed: int, result: ParsedResponse | InvalidResponse
) -> bool:
    """Whether a parsed move is a verdict given in a round where the verifier may not decide
    (possible only under `early_decision_ends_episode`, which then ends the episode)."""
    return (
        isinstance(result, ParsedResponse)
        and result.decision is not None
        and not verifier_can_decide(protocol, round, episode_seed)
    )


def _response(text: str, result: ParsedResponse | InvalidResponse, retries: int) -> AgentResponse:
    if isinstance(result, InvalidResponse):
        return AgentResponse(
            raw=text, retries=retries, failure=_failure_text(retries, result, text)
        )
    return AgentResponse(
        raw=text, messages=dict(result.messages), decision=result.decision, retries=retries
    )
