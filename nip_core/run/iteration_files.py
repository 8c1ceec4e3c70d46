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
PROVENANCE_FILE = "provenance.json"  # commit, machine, configuration and command of every start


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
    """`datasets/<kind>`: the exported datasets of one kind ("dpo", "kto" or "sft")."""
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


def nodes_file(stem: str) -> str:
    """`<stem>-nodes.parquet`: an evaluation's full turns (`eval-nodes.parquet`), for transcripts."""
    return f"{stem}-nodes.parquet"


def verdicts_file(stem: str) -> str:
    """`<stem>-verdicts.parquet`: the verifier's P(accept) on each evaluated episode."""
    return f"{stem}-verdicts.parquet"


def likelihoods_file(stem: str) -> str:
    """`<stem>-likelihoods.parquet`: the base model's log-likelihood of each shown solution of
    the evaluated pairs (the pairwise protocol's likelihood baseline)."""
    return f"{stem}-likelihoods.parquet"


def steps_group(path: str) -> str:
    """The model group whose `fine_tune/<group>-steps.parquet` lies at `path`."""
    return path.rsplit("/", 1)[-1].removesuffix("-steps.parquet")


# ------------------------------------------------------------------ shards and call journals


def rollout_shard_file(shard: int) -> str:
    """`shards/nodes-<NNNNN>.parquet`: one rollout shard's trees, checkpointed when complete."""
    return f"shards/nodes-{shard:05d}.parquet"


def shard_call_journal(shard: int) -> str:
    """`calls-shard-<NNNNN>.jsonl`: the call journal of a shard grown as a task of its own."""
    return f"calls-shard-{shard:05d}.jsonl"


def journal_part(journal: str, endpoint: int) -> str:
    """`<journal stem>-<i>.jsonl`: the part of a call journal one endpoint's client writes."""
    return f"{journal.removesuffix('.jsonl')}-{endpoint}.jsonl"


def stem_call_journal(stem: str, endpoint: int) -> str:
    """`<stem>-calls-<i>.jsonl`: an evaluation's (or the switch guard's) call journal part."""
    return f"{stem}-calls-{endpoint}.jsonl"


def evaluation_shard_file(stem: str, shard: int) -> str:
    """`<stem>-shards/nodes-<NNNNN>.parquet`: one evaluation shard's episodes."""
    return f"{stem}-shards/nodes-{shard:05d}.parquet"


def evaluation_shard_stem(stem: str, shard: int) -> str:
    """`<stem>-shard-<NNNNN>`: the journal stem of one evaluation shard."""
    return f"{stem}-shard-{shard:05d}"


GUARD_STEM = "guard"  # the switch guard's journal stem: `guard-calls-<i>.jsonl`


def guard_file(label: str) -> str:
    """`guard-<label>.parquet`: one switch-guard scoring ("previous" or a model group)."""
    return f"{GUARD_STEM}-{label}.parquet"


# ------------------------------------------------------------------ an experiment's folders

EXPERIMENT_TIMINGS_FILE = "experiment_timings.json"  # in an arm's run folder, per iteration
# A finished seed's outputs, in `seeds/<seed>/` of the experiment folder; timings last.
SEED_FILES = ("rows.parquet", "training.parquet", "timings.parquet")
EXPERIMENT_FILE = "experiment.parquet"  # one row per seed, arm, iteration, datapoint, sample
SUMMARY_FILE = "summary.parquet"  # per seed and across seeds, with confidence intervals
TRAINING_FILE = "training.parquet"  # per seed, arm, iteration and group: rows, switch, trainer
EXPERIMENT_PNG = "experiment.png"  # the learning curves
EXPERIMENT_HTML = "experiment.html"  # the experiment's page


def seed_folder(seed: int) -> str:
    """`seeds/<seed>`: one seed's run folders and outputs, relative to the experiment folder."""
    return f"seeds/{seed}"
