"""The file names of a run folder and of its iteration folders, spelled once.

    <run>/hyper_params.json, report.html, wandb_run_id, lm_server/
    <run>/iterations/<NNNN>/manifest.json, batch.parquet, nodes.parquet, rewards.parquet, ...

Paths are relative: to the run folder (`RunPaths.run_dir`) for the first group, to the
iteration folder (`RunPaths.iteration_file`) for the rest.
"""

# ------------------------------------------------------------------ the run folder

HYPER_PARAMS_FILE = "hyper_params.json"  # the run's configuration, checked on every start
ITERATIONS_DIR = "iterations"  # one folder per iteration, named by `iteration_folder`
REPORT_FILE = "report.html"  # the run's report page (`python -m flows.report`)
RUN_ID_FILE = "wandb_run_id"  # the wandb run every start of this run appends to
LM_SERVER_DIR = "lm_server"  # state and log of a self-hosted server a flow started


def iteration_folder(iteration: int) -> str:
    """`iterations/<NNNN>`: the folder of one iteration, relative to the run folder."""
    return f"{ITERATIONS_DIR}/{iteration:04d}"


# ------------------------------------------------------------------ an iteration folder

MANIFEST_FILE = "manifest.json"  # the stages done, their files' checksums and the statistics
BATCH_FILE = "batch.parquet"  # the datapoints of this iteration
NODES_FILE = "nodes.parquet"  # the response trees, one row per node
REWARDS_FILE = "rewards.parquet"  # expected reward of every node for every agent
PAIRS_FILE = "pairs.parquet"  # the selected preference pairs
CALL_JOURNAL_FILE = "calls.jsonl"  # finished model calls of the rollouts, replayed on resume
FINE_TUNE_STEPS_FILE = "fine_tune/{group}-steps.parquet"  # a group's training metrics per step
DATASETS_DIR = "datasets"  # the exported training data, `dataset_file`


def dataset_folder(kind: str) -> str:
    """`datasets/<kind>`: the exported datasets of one kind ("dpo" or "sft")."""
    return f"{DATASETS_DIR}/{kind}"


def dataset_file(kind: str, group: str, suffix: str) -> str:
    """`datasets/<kind>/<group>.<suffix>`: a model group's dataset, "parquet" (ours) or "jsonl"
    (the fine-tuning API's)."""
    return f"{dataset_folder(kind)}/{group}.{suffix}"


def fine_tune_record(group: str) -> str:
    """`fine_tune/<group>.json`: a model group's fine-tune job, written right after submission."""
    return f"fine_tune/{group}.json"


def fine_tune_steps(group: str) -> str:
    """`fine_tune/<group>-steps.parquet`: the group's training metrics per step."""
    return FINE_TUNE_STEPS_FILE.format(group=group)


def table_file(stem: str) -> str:
    """`<stem>.parquet`, e.g. an evaluation's table (`eval.parquet` for the test split)."""
    return f"{stem}.parquet"
