"""LLM agents: what they are shown (prompts), how their replies are read (parsing) and sampled.

chat = chat_messages(protocol, "verifier", params, datapoint, turns, round, episode_seed)
responses = await generate_responses(
    client, protocol, "verifier", params, model, chat, n, round, episode_seed, seed
)
"""

from nip_core.agents.clients import (
    ChatClient,
    DirectHttpChatClient,
    DummyChatClient,
    SamplingParams,
    make_chat_client,
)
from nip_core.agents.parsing import (
    InvalidResponse,
    ParsedResponse,
    looks_like_decision_attempt,
    parse_decision,
    parse_response,
    split_by_headers,
    stated_verdicts,
)
from nip_core.agents.prompts import (
    TEMPLATE_DIR,
    chat_messages,
    history_messages,
    prompt_variables,
    supervisor_message,
    system_prompt,
    training_conversation,
)
from nip_core.agents.respond import AgentResponse, attempt_seed, generate_responses, sampling_params

__all__ = [
    "TEMPLATE_DIR",
    "AgentResponse",
    "ChatClient",
    "DirectHttpChatClient",
    "DummyChatClient",
    "InvalidResponse",
    "ParsedResponse",
    "SamplingParams",
    "attempt_seed",
    "chat_messages",
    "generate_responses",
    "history_messages",
    "looks_like_decision_attempt",
    "make_chat_client",
    "parse_decision",
    "parse_response",
    "prompt_variables",
    "sampling_params",
    "split_by_headers",
    "stated_verdicts",
    "supervisor_message",
    "system_prompt",
    "training_conversation",
]
