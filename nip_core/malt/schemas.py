"""Arrow schemas of every Parquet artifact, declared once."""

from __future__ import annotations

import pyarrow as pa

MESSAGE = pa.struct([("agent", pa.string()), ("channel", pa.string()), ("content", pa.string())])
RAW_MESSAGE = pa.struct([("agent", pa.string()), ("content", pa.string())])
AGENT_REWARD = pa.struct([("agent", pa.string()), ("reward", pa.float64())])
CHAT_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string())])
CHAT = pa.list_(CHAT_MESSAGE)

BATCH = pa.schema(
    [
        ("batch_index", pa.int64()),
        ("datapoint_id", pa.int64()),
        ("question", pa.string()),
        ("solution", pa.string()),
        ("y", pa.int64()),
        ("prover_stance", pa.int64()),
        ("episode_seed", pa.int64()),
        # the second solution of a pair (pairwise and fill-in protocols); null elsewhere
        ("other_solution", pa.string()),
    ]
)

# One row per tree node. The root (round -1) is the empty episode; a node at round r holds
# what the agents active in round r wrote.
NODES = pa.schema(
    [
        ("datapoint_id", pa.int64()),
        ("batch_index", pa.int64()),
        ("node_id", pa.string()),
        ("parent_id", pa.string()),
        ("round", pa.int64()),
        ("messages", pa.list_(MESSAGE)),
        ("raw_messages", pa.list_(RAW_MESSAGE)),
        ("acted", pa.list_(pa.string())),
        ("decision", pa.int64()),
        ("y", pa.int64()),
        ("ended", pa.bool_()),
        ("terminated", pa.bool_()),
        ("step_rewards", pa.list_(AGENT_REWARD)),
        ("retries", pa.int64()),
        ("failure", pa.string()),
    ]
)

REWARDS = pa.schema(
    [
        ("datapoint_id", pa.int64()),
        ("node_id", pa.string()),
        ("round", pa.int64()),
        ("agent", pa.string()),
        ("active", pa.bool_()),
        ("reward", pa.float64()),
        ("expected_reward", pa.float64()),
        ("threshold", pa.float64()),
        ("is_positive", pa.bool_()),
    ]
)

PAIRS = pa.schema(
    [
        ("agent", pa.string()),
        ("datapoint_id", pa.int64()),
        ("round", pa.int64()),
        ("parent_node_id", pa.string()),
        ("chosen_node_id", pa.string()),
        ("rejected_node_id", pa.string()),
        ("chosen_expected_reward", pa.float64()),
        ("rejected_expected_reward", pa.float64()),
        ("method", pa.string()),
    ]
)

_ROLE_CONTENT = pa.struct([("role", pa.string()), ("content", pa.string())])

# TRL's conversational preference format plus tracing columns.
DPO = pa.schema(
    [
        ("prompt", pa.list_(_ROLE_CONTENT)),
        ("chosen", pa.list_(_ROLE_CONTENT)),
        ("rejected", pa.list_(_ROLE_CONTENT)),
        ("iteration", pa.int64()),
        ("agent", pa.string()),
        ("datapoint_id", pa.int64()),
        ("parent_node_id", pa.string()),
        ("chosen_node_id", pa.string()),
        ("rejected_node_id", pa.string()),
        ("chosen_expected_reward", pa.float64()),
        ("rejected_expected_reward", pa.float64()),
        ("guess_replaced", pa.bool_()),
    ]
)

# TRL's conversational unpaired format (KTO) plus tracing columns.
KTO = pa.schema(
    [
        ("prompt", pa.list_(_ROLE_CONTENT)),
        ("completion", pa.list_(_ROLE_CONTENT)),
        ("label", pa.bool_()),
        ("iteration", pa.int64()),
        ("agent", pa.string()),
        ("datapoint_id", pa.int64()),
        ("parent_node_id", pa.string()),
        ("node_id", pa.string()),
        ("expected_reward", pa.float64()),
        ("advantage", pa.float64()),
    ]
)

SFT = pa.schema(
    [
        ("messages", pa.list_(_ROLE_CONTENT)),
        ("iteration", pa.int64()),
        ("agent", pa.string()),
        ("datapoint_id", pa.int64()),
        ("leaf_node_id", pa.string()),
        ("episode_reward", pa.float64()),
        ("guess_replaced", pa.bool_()),
    ]
)
