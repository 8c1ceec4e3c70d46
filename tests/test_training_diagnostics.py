"""Training diagnostics: token counts in the training child, the steps table of a job's events,
the steps file written once per job, the report's Training table and the per-arm summary."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pandas as pd
import pytest

from nip_core.experiment.training_diagnostics import (
    group_outcomes,
    read_training,
    training_rows,
)
from nip_core.lm_server.dataset_stats import dataset_stats, dataset_summary_line, example_tokens
from nip_core.report.html import fine_tune_table, report_html
from nip_core.run.artifacts import RunPaths
from nip_core.run.iteration_files import FINE_TUNE_STEPS_FILE
from nip_core.training.fine_tune_jobs import DUMMY_JOB_ID, GroupState
from nip_core.training.job_diagnostics import (
    dataset_info,
    fetch_events,
    last_epoch_loss,
    read_steps,
    record_training_diagnostics,
    step_seconds,
    steps_table,
    training_summary,
)

ROLES = {"system": 1, "user": 2, "assistant": 3}
END = 9


class CharTokenizer:
    """A chat template with one token per character: <role> chars... <end> per message, and
    the assistant role token as the generation prompt."""

    def apply_chat_template(
        self, messages, tokenize=True, return_dict=True, add_generation_prompt=False
    ):
        ids = []
        for m in messages:
            ids += [ROLES[m["role"]], *(ord(c) for c in m["content"]), END]
        if add_generation_prompt:
            ids.append(ROLES["assistant"])
        return {"input_ids": ids}


def msg(role: str, content: str) -> dict:
    return {"role": role, "content": content}


DPO_ROW = {
    "prompt": [msg("system", "s"), msg("user", "abcd")],
    "chosen": [msg("assistant", "yes")],
    "rejected": [msg("assistant", "no")],
}


def test_dpo_counts_follow_trl_prompt_completion_split():
    counts = example_tokens(CharTokenizer(), DPO_ROW, "dpo")
    # prompt: [s-role s end] [u-role a b c d end] + the generation prompt (the assistant role)
    assert counts == {"prompt": 10, "completion": 4, "rejected": 3, "sequence": 14}


def test_sft_completion_is_the_last_assistant_message():
    row = {"messages": [msg("user", "ab"), msg("assistant", "x"), msg("user", "c")]}
    row["messages"].append(msg("assistant", "long"))
    counts = example_tokens(CharTokenizer(), row, "supervised")
    assert counts["completion"] == len("long") + 1  # the role token is in the prompt
    assert counts["sequence"] == 4 + 3 + 3 + 6 and "rejected" not in counts


def test_dataset_stats_counts_examples_longer_than_max_length():
    short = dict(DPO_ROW, prompt=[msg("user", "a")])
    stats = dataset_stats(CharTokenizer(), [DPO_ROW, short], "dpo", 12, "keep_start", kept=2)
    assert stats["kind"] == "dataset" and stats["examples"] == 2 and stats["kept"] == 2
    assert stats["per_example"]["sequence"] == [14, 8] and stats["truncated"] == 1
    assert stats["tokens"]["sequence"] == {"mean": 11.0, "max": 14}
    assert stats["tokens"]["prompt"]["max"] == 10
    assert "1 longer than max_length 12" in dataset_summary_line(stats)
    json.dumps(stats)  # it travels as an event's data
    assert dataset_stats(CharTokenizer(), [DPO_ROW], "dpo", None)["truncated"] == 0


def ev(data, message="m"):
    return {"id": f"ev{id(data)}", "message": message, "data": data}


DATASET = {"kind": "dataset", "examples": 8, "kept": 7, "max_length": 1024, "truncated": 1}
DATASET["tokens"] = {"sequence": {"mean": 300.5, "max": 1100}}
DPO_STEP = {"loss": 0.7, "logps/chosen": -40.0, "logps/rejected": -41.0, "rewards/margins": 0.1}
DPO_STEP |= {"rewards/accuracies": 0.5, "rewards/chosen": 0.05, "rewards/rejected": -0.05}
EVENTS = [  # oldest first
    ev(None, "Created fine-tuning job"),
    ev(DATASET),
    ev({"step": 1, "epoch": 0.5, **DPO_STEP, "learning_rate": 1e-4, "grad_norm": 2.0}),
    ev({"step": 2, **DPO_STEP, "loss": 0.9}),
    ev({"step": 2, **DPO_STEP, "loss": 0.5, "rewards/margins": 0.8}),  # logged twice: the last
    ev({"step": 2, "train_loss": 0.6, "train_runtime": 3.0}),  # the end-of-training summary
    ev({"step": 3, "train_loss": 0.4, "total_steps": 3}),  # OpenAI's shape: no "loss"
    ev("text"),
]


def test_steps_table_has_one_row_per_step_with_the_dpo_columns():
    steps = steps_table(EVENTS)
    assert steps["step"].tolist() == [1, 2] and steps["loss"].tolist() == [0.7, 0.5]
    assert steps["rewards_margins"].tolist() == [0.1, 0.8]
    assert {"logps_chosen", "logps_rejected", "rewards_accuracies", "epoch"} <= set(steps)
    assert steps["step"].dtype == "int64" and steps["loss"].dtype == "float64"
    assert pd.isna(steps["epoch"].iloc[1])
    assert dataset_info(EVENTS) == DATASET


def test_step_seconds_are_the_timed_steps_in_order():
    timed = [ev({"step": 2, "loss": 0.5, "step_seconds": 3.0}), ev({"step": 1, "loss": 0.7})]
    assert step_seconds([*timed, ev({"step": 3, "loss": 0.4, "step_seconds": 2.5})]) == [3.0, 2.5]
    assert step_seconds(EVENTS[:1]) == [] and step_seconds([]) == []


def test_sft_events_and_no_events_give_narrow_tables():
    sft = steps_table([ev({"step": 1, "loss": 2.0, "mean_token_accuracy": 0.1})])
    assert list(sft.columns) == ["step", "loss"]
    empty = steps_table([ev(None), ev({"step": 1, "train_loss": 1.0})])
    assert empty.empty and list(empty.columns) == ["step", "loss"]
    summary = training_summary(empty, None)
    assert summary["steps"] == 0 and summary["first_loss"] is None and summary["examples"] is None


def test_summary_is_compact_and_json_safe():
    summary = training_summary(steps_table(EVENTS), DATASET)
    assert summary == {
        "examples": 8, "tokens_mean": 300.5, "tokens_max": 1100, "max_length": 1024,
        "truncated": 1, "dropped": 1, "steps": 2, "first_loss": 0.7, "last_loss": 0.5, "last_epoch_loss": 0.6, "last_margin": 0.8,
    }  # fmt: skip
    nan_loss = steps_table([ev({"step": 1, "loss": float("nan")})])
    assert training_summary(nan_loss, None)["last_loss"] is None


def test_last_epoch_loss_is_the_mean_over_the_last_epochs_steps():
    epochs = [0.5, 1.0, 1.5, 2.0, 2.5, None, 3.0]  # a step may log no epoch
    losses = [0.9, 0.8, 0.4, 0.2, 0.1, 1.7, 0.1]  # a spike at the sixth step
    steps = steps_table(
        [ev({"step": i, "loss": loss} | ({"epoch": e} if e else {})) for i, (e, loss) in
         enumerate(zip(epochs, losses, strict=True), 1)]
    )  # fmt: skip
    assert last_epoch_loss(steps) == pytest.approx((0.1 + 1.7 + 0.1) / 3)
    assert last_epoch_loss(steps.iloc[:2]) == pytest.approx(0.85)  # one epoch: every step
    assert last_epoch_loss(steps.drop(columns="epoch")) == pytest.approx(sum(losses) / 7)
    assert last_epoch_loss(steps_table([])) is None


class FakeJobs:
    """`client.fine_tuning.jobs.list_events`, newest first, paged like the API."""

    def __init__(self, events, fail=None):
        self.newest_first = [SimpleNamespace(**e) for e in reversed(events)]
        self.calls, self.fail = 0, fail

    async def list_events(self, job_id, limit=20, after=None):
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        ids = [e.id for e in self.newest_first]
        start = ids.index(after) + 1 if after else 0
        data = self.newest_first[start : start + limit]
        return SimpleNamespace(data=data, has_more=start + limit < len(ids))


def fake_group(events, job_id="ftjob-1", fail=None, name="verifier"):
    jobs = FakeJobs(events, fail)
    client = SimpleNamespace(fine_tuning=SimpleNamespace(jobs=jobs))
    return SimpleNamespace(name=name, client=client, state=GroupState(fine_tune_job_id=job_id))


def test_fetch_events_reads_every_page_oldest_first():
    group = fake_group(EVENTS)
    events = asyncio.run(fetch_events(group.client, "ftjob-1", page_size=3))
    assert [e.data for e in events] == [e["data"] for e in EVENTS]
    assert group.client.fine_tuning.jobs.calls == 3


def test_steps_file_is_written_once_per_job(tmp_path):
    paths = RunPaths.open(str(tmp_path), "run")
    path = paths.iteration_file(0, FINE_TUNE_STEPS_FILE.format(group="verifier"))
    first = asyncio.run(record_training_diagnostics(paths, 0, fake_group(EVENTS)))
    assert first["last_margin"] == 0.8 and paths.fs.exists(path)
    steps, dataset, job = read_steps(paths.fs, path)
    assert len(steps) == 2 and dataset == DATASET and job == "ftjob-1"
    resumed = fake_group([], fail=AssertionError("must not refetch"))
    assert asyncio.run(record_training_diagnostics(paths, 0, resumed)) == first
    assert resumed.client.fine_tuning.jobs.calls == 0
    other_job = fake_group(EVENTS[:3], job_id="ftjob-2")  # a resubmitted job: its own events
    assert asyncio.run(record_training_diagnostics(paths, 0, other_job))["steps"] == 1
    assert read_steps(paths.fs, path)[2] == "ftjob-2"


def test_jobs_without_events_never_fail_the_stage(tmp_path):
    import openai

    paths = RunPaths.open(str(tmp_path), "run")
    dummy = SimpleNamespace(name="v", client=None, state=GroupState(fine_tune_job_id=DUMMY_JOB_ID))
    assert asyncio.run(record_training_diagnostics(paths, 0, dummy)) is None
    broken = fake_group([], fail=openai.APIConnectionError(request=None), name="p")
    asyncio.run(record_training_diagnostics(paths, 0, broken))  # logged, no exception
    assert not paths.fs.exists(paths.iteration_file(0, "fine_tune"))
    silent = asyncio.run(record_training_diagnostics(paths, 0, fake_group([ev(None)])))
    assert silent["steps"] == 0
    steps, summary = read_training(
        paths.fs, paths.iteration_file(0, "fine_tune/verifier-steps.parquet")
    )
    assert steps.empty and summary["steps"] == 0


def test_report_shows_a_training_row_per_job():
    summary = training_summary(steps_table(EVENTS), DATASET)
    empty = training_summary(steps_table([]), None)  # a dummy-engine job: nothing to show
    fine_tunes = {0: {"verifier": {"training": summary}, "prover": {"training": empty}}}
    fine_tunes[1] = {"verifier": {"status": "succeeded"}}
    table = fine_tune_table(fine_tunes)
    assert table[["iteration", "group", "truncated", "last loss"]].values.tolist() == [
        [0, "verifier", 1, 0.5]
    ]
    stats = pd.DataFrame({"iteration": [0]})
    page = report_html("r", stats, [], "", None, fine_tunes=fine_tunes)
    assert "<h3>Training</h3>" in page and "last margin" in page
    assert "<h3>Training</h3>" not in report_html("r", stats, [], "", None, fine_tunes={0: {}})


def test_training_rows_take_steps_from_the_table_and_tokens_from_the_summary():
    steps = steps_table(EVENTS)
    summary = training_summary(steps, DATASET)
    entries = [
        (1, "malt", 0, steps, summary),
        (2, "malt", 0, steps.assign(loss=[0.9, 0.3]), dict(summary, truncated=0)),
        (1, "ei", 0, steps_table([]), None),
    ]
    rows = training_rows(entries)
    assert len(rows) == 3 and rows.loc[2, "steps"] == 0 and pd.isna(rows.loc[2, "last_loss"])
    # how far each job trained: the last step's epoch (step 2 logged none, step 1 half an epoch)
    assert rows.loc[0, "epochs"] == 0.5 and pd.isna(rows.loc[2, "epochs"])
    assert rows.loc[0, "truncated"] == 1 and rows.loc[1, "truncated"] == 0
    # the rows the job trained on, from its dataset summary (none where no job ran)
    assert rows.loc[0, "job_examples"] == 8 and pd.isna(rows.loc[2, "job_examples"])
    assert rows.loc[1, "last_loss"] == 0.3 and rows.loc[0, "last_accuracy"] == 0.5
    assert rows.loc[1, "last_epoch_loss"] == pytest.approx(0.6) and pd.isna(
        rows.loc[2, "last_epoch_loss"]
    )


def stages(export: dict, fine_tune: dict, guard: dict | None = None) -> dict:
    """An iteration manifest's stages as the export, fine-tune and guard stages record them."""
    found = {"export": {"info": export}, "fine_tune": {"info": fine_tune}}
    return found | ({"switch_guard": {"info": guard}} if guard is not None else {})


def test_group_outcomes_say_what_became_of_each_groups_model():
    exported = {"prover": {"rows": 0}, "verifier": {"rows": 6}, "judge": {"rows": 9}}
    jobs = {
        "prover": {"status": "succeeded", "skip_reason": "0 examples < 1 required"},
        "verifier": {"status": "succeeded", "skip_reason": None},
        "judge": {"status": "succeeded", "skip_reason": None},
    }
    guard = {
        "verifier": {"verdict": "kept_previous", "reason": "constant_verdict"},
        "judge": {"verdict": "switched", "reason": None},
    }
    assert group_outcomes(stages(exported, jobs, guard)) == {
        "prover": {"examples": 0, "switch": "not_trained", "reason": "0 examples < 1 required"},
        "verifier": {"examples": 6, "switch": "kept_previous", "reason": "constant_verdict"},
        "judge": {"examples": 9, "switch": "switched", "reason": ""},
    }
    # no guard: a job's model goes in; a stage that did not record its rows says nothing
    unguarded = group_outcomes(stages({"verifier": {"rows": 6}}, jobs))
    assert unguarded == {"verifier": {"examples": 6, "switch": "switched", "reason": ""}}
    assert group_outcomes(stages({"verifier": {"kind": "dpo"}}, jobs)) == {}
    assert group_outcomes({}) == {}


def test_training_table_has_a_row_per_group_trained_or_not(tmp_path):
    from nip_core.experiment.seed_outputs import training_table
    from nip_core.run.artifacts import write_json

    paths = RunPaths.open(str(tmp_path), "nip")
    asyncio.run(record_training_diagnostics(paths, 0, fake_group(EVENTS)))  # verifier's steps
    jobs = {
        "prover": {"status": "succeeded", "skip_reason": "0 examples < 1 required"},
        "verifier": {"status": "succeeded", "skip_reason": None},
    }
    exported = {"prover": {"rows": 0}, "verifier": {"rows": 2}}
    guard = {"verifier": {"verdict": "switched", "reason": None}}
    write_json(paths.fs, paths.manifest(0), {"stages": stages(exported, jobs, guard)})
    table = training_table({"nip": paths}, seed=7, iterations=2)  # iteration 2 never ran
    assert table[["iteration", "group", "examples", "switch", "steps"]].values.tolist() == [
        [1, "prover", 0, "not_trained", 0],
        [1, "verifier", 2, "switched", 2],
    ]
    assert table.loc[1, "last_margin"] == 0.8 and pd.isna(table.loc[0, "last_loss"])
    assert training_table({}, seed=7, iterations=1).columns[-4:].tolist() == [
        "group",
        "examples",
        "switch",
        "reason",
    ]
