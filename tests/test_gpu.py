"""The GPU path: the embedded model served and LoRA-trained on a CUDA GPU, and the easy
experiment's `malt` arm with two seeds side by side. A call to a lent GPU may run 9 minutes and
the shipped recipe's DPO job took ~3 minutes on an H200, its steps bound by kernel launches, not
by the GPU (docs/serving.md): the experiment test runs two iterations of two epochs, the
recipe's two pairs per optimizer step in one batch instead of two accumulated. Selected by
`pytest -m gpu`; skipped where torch sees no CUDA GPU (the default `-m 'not gpu'` deselects
them elsewhere)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.conftest_lm import dpo_lines, running_server, upload, wait_job
from tests.test_experiment_side_by_side import overlap


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU"),
]
REPO = Path(__file__).resolve().parent.parent
BASE = "SmolLM2-135M-Instruct"
PROMPT = [{"role": "user", "content": "Is 3+3=6? Answer in one word."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ["--engine", "transformers"]  # the embedded model, on the GPU torch finds
    with running_server(args, tmp_path_factory.mktemp("gpu") / "state") as srv:
        yield srv


def _seeded(client, model: str) -> list[str]:
    reply = client.chat.completions.create(
        model=model, messages=PROMPT, n=4, temperature=1.0, seed=11, max_tokens=12
    )
    return [c.message.content for c in reply.choices]


def gpu_pids() -> set[int]:
    """Processes holding CUDA memory, as nvidia-smi lists them."""
    import subprocess

    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {int(line) for line in out.split() if line.strip().isdigit()}


def test_transformers_engine_serves_the_embedded_model_on_the_gpu(server):
    client = server.client()
    assert BASE in [m.id for m in client.models.list()]
    first, again = _seeded(client, BASE), _seeded(client, BASE)
    assert first == again and any(text.strip() for text in first)  # seeded: reproducible
    assert server.proc.pid in gpu_pids(), "the server answered without holding the GPU"


def test_lora_dpo_job_trains_on_the_gpu_and_is_switched_in(server):
    client = server.client()
    job = client.fine_tuning.jobs.create(
        model=BASE,
        training_file=upload(client, dpo_lines(16)).id,
        method={"type": "dpo", "dpo": {"hyperparameters": {"n_epochs": 3, "batch_size": 4}}},
        suffix="gpu",
        extra_body={"nip_training": {"learning_rate": 5e-3, "lora_rank": 8, "seed": 3}},
    )
    done = wait_job(client, job.id, timeout=600)
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model in [m.id for m in client.models.list()]
    assert _seeded(client, done.fine_tuned_model) != _seeded(client, BASE)
    events = [e.message for e in client.fine_tuning.jobs.list_events(done.id, limit=100)]
    assert any(m.startswith("Step ") and "loss=" in m for m in events)
    assert any(
        m.startswith("Training dpo") and " on cuda:0, frozen weights in bf16" in m for m in events
    )


def test_easy_experiment_two_seeds_on_one_gpu(prefect_harness, tmp_path):
    from flows.experiment import main as experiment_main

    args = [
        "--config",
        str(REPO / "configs" / "experiment-cpu-easy.yaml"),
        "--artifacts-root",
        str(tmp_path),
        "--run-name",
        "gpu-easy",
        "--no-wandb",
        "--set",
        "experiment.seeds=2",
        "--set",
        "experiment.iterations=2",
        "--set",
        "experiment.arms={malt: {}}",
        "--set",
        "agents._default.num_epochs=2",
        "--set",
        "agents._default.per_device_train_batch_size=2",
        "--set",
        "agents._default.gradient_accumulation_steps=1",
        "--set",
        "server.engine=transformers",
        "--set",
        "agents._default.language_model_server_port=5391",
    ]
    assert experiment_main(args) == 0
    summary = pd.read_parquet(tmp_path / "gpu-easy" / "summary.parquet")
    malt = summary[(summary.scope == "seed") & (summary.arm == "malt") & (summary.iteration > 0)]
    assert malt.groupby("seed")["iteration"].apply(sorted).tolist() == [[1, 2], [1, 2]]
    assert malt["auc"].notna().all() and (malt["decision_rate"] > 0).all()
    # Across seeds, a trained arm's curve starts at the base model (iteration 0).
    across = summary[(summary.scope == "across_seeds") & (summary.arm == "malt")]
    assert sorted(across["iteration"]) == [0, 1, 2] and (across["seeds"] == 2).all()
    assert overlap(tmp_path / "gpu-easy", (6198, 6199)), "on a GPU the two seeds run side by side"
