"""The file names of an iteration folder (`iterations/<NNNN>/`), spelled once."""

BATCH_FILE = "batch.parquet"  # the datapoints of this iteration
NODES_FILE = "nodes.parquet"  # the response trees, one row per node
REWARDS_FILE = "rewards.parquet"  # expected reward of every node for every agent
PAIRS_FILE = "pairs.parquet"  # the selected preference pairs
CALL_JOURNAL_FILE = "calls.jsonl"  # finished model calls of the rollouts, replayed on resume
FINE_TUNE_STEPS_FILE = "fine_tune/{group}-steps.parquet"  # a group's training metrics per step
