"""Which datasets a group's fine-tune job trains on (`fine_tune_on_all_previous_rollouts`)."""

from __future__ import annotations

import json

from nip_core.malt.dataset_export import training_datasets


def info(kind: str, rows: int, it: int) -> dict:
    return {"kind": kind, "rows": rows, "jsonl": f"datasets/{kind}/v{it}.jsonl"}


# two EI iterations (SFT) then two MALT iterations (DPO); the prover group skips iteration 3
EXPORTS = {
    0: {"verifier": info("sft", 5, 0), "prover": info("sft", 3, 0)},
    1: {"verifier": info("sft", 6, 1), "prover": info("sft", 2, 1)},
    2: {"verifier": info("dpo", 7, 2), "prover": info("dpo", 4, 2)},
    3: {"verifier": info("dpo", 8, 3)},
}


def test_only_this_iteration_by_default():
    assert training_datasets(EXPORTS, "verifier", 3, all_previous=False) == [
        (3, EXPORTS[3]["verifier"])
    ]


def test_all_previous_takes_every_earlier_dataset_of_the_same_kind_oldest_first():
    chosen = training_datasets(EXPORTS, "verifier", 3, all_previous=True)
    assert [it for it, _ in chosen] == [2, 3]  # the SFT rounds of EI are not DPO data
    assert [it for it, _ in training_datasets(EXPORTS, "verifier", 1, True)] == [0, 1]


def test_a_group_without_data_this_iteration_trains_on_nothing():
    assert training_datasets(EXPORTS, "prover", 3, all_previous=True) == []
    assert training_datasets(EXPORTS, "nobody", 0, all_previous=True) == []


def test_fine_tune_stage_concatenates_every_iteration_so_far(prefect_harness, tmp_path):
    from flows.malt_run import malt_run
    from nip_core.parameters import load_hyper_params
    from nip_core.run.artifacts import RunPaths
    from nip_core.run.iteration_context import build_context
    from nip_core.training.fine_tune_stage import earlier_exports, training_data

    overrides = [
        "agents._default.use_dummy_api=true",
        "interaction_protocol=solo_verifier",
        "rl.num_iterations=2",
        "rl.rollouts_per_iteration=8",
        "pure_text_malt.num_responses_per_timestep=4",
        "text_rl.fine_tune_on_all_previous_rollouts=true",
    ]
    malt_run(overrides, run_name="all", artifacts_root=str(tmp_path), use_wandb=False)
    hp = load_hyper_params("configs/default.yaml", overrides)
    paths = RunPaths.open(str(tmp_path), "all")
    context = build_context(hp, "all", 1)
    manifest = json.loads((tmp_path / "all" / "iterations" / "0001" / "manifest.json").read_text())
    this_iteration = manifest["stages"]["export"]["info"]
    exports = earlier_exports(paths, context) | {1: this_iteration}
    assert exports[1] == this_iteration and exports[0]["verifier"]["kind"] == "dpo"
    jsonl, rows, method = training_data(paths, context, exports, "verifier")
    parts = [
        (tmp_path / "all" / "iterations" / f"{it:04d}" / "datasets/dpo/verifier.jsonl").read_bytes()
        for it in (0, 1)
    ]
    assert method == "dpo" and jsonl == b"".join(parts)
    assert rows == len(jsonl.splitlines()) > len(parts[1].splitlines())
