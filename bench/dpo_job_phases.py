"""Benchmark: where a DPO fine-tuning job's wall time goes on our server, and the share of it
spent in optimisation steps.

    python bench/dpo_job_phases.py                          # the easy config's job: 64 pairs, 4 epochs
    python bench/dpo_job_phases.py --pairs 4 --epochs 1     # a quick look on a loaded CPU

The path users run: `python -m nip_core.lm_server --engine transformers` as a child process on a
free loopback port (the GPU torch finds, else the CPU), the real `openai` SDK uploading a DPO file
and creating the job with the shipped easy experiment's options (`configs/experiment-cpu-easy.yaml`:
LoRA rank 16 alpha 32 on every layer, batch 1 with 2 accumulated, learning rate 6e-4, RPO 0.2, no
activation checkpointing, the file's order). The pairs look like the verifier's: a question and a
solution from the shipped train split, "Decision: accept" over "Decision: reject" (or the reverse,
by the row's label).

Each phase is read off the job's own events (one-second stamps): queued until the training child
starts, validating the file, loading the model and building the trainer, up to the first logged
step, the steps, saving. After the job: the first answer from the fine-tuned model (its adapter
loaded by the engine) and 16 answers at once (what the switch guard asks). The last line is
`ratio train_steps/job_wall: <x>` (the trainer's own `train_runtime` over created -> finished).

    python bench/dpo_job_phases.py --pairs 8 --epochs 2 --compare-serve-during-training

runs the job twice on a vLLM-served server (`.venv-vllm`), vLLM answering one chat before each
job as rollouts would: stopped while the job trains (the default), then kept up beside it
(`--vllm-serve-during-training`), and ends with `ratio step serving/stopped: <x>` (the median
optimizer step, kept up over stopped: does vLLM idle beside the job slow it?) and `ratio
serving/stopped: <x>`, the time from creating the job to the fine-tuned model's first answer,
kept up over stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_generation import (  # noqa: E402
    ROOT,
    _free_port,
    _send_all,
    _wait_up,
    train_rows,
    verifier_chat,
)

from nip_core.lm_server.embedded_model import EMBEDDED_MODEL_NAME  # noqa: E402
from nip_core.training.job_diagnostics import step_seconds  # noqa: E402


def verifier_pairs(count: int) -> list[dict]:
    """`count` DPO rows in the fine-tuning API's format: a verifier's question about a solution
    from the train split (the user turn of `cpu_generation.verifier_chat`), the labelled verdict
    preferred."""
    rows = []
    for row in train_rows(count).itertuples():
        right, wrong = ("accept", "reject") if row.y else ("reject", "accept")
        rows.append(
            {
                "input": {"messages": verifier_chat(row)[1:]},
                "preferred_output": [{"role": "assistant", "content": f"Decision: {right}"}],
                "non_preferred_output": [{"role": "assistant", "content": f"Decision: {wrong}"}],
            }
        )
    return rows


def phases(created: int, finished: int, events: list[dict]) -> list[tuple[str, int]]:
    """(phase, seconds) from the job's events, oldest first; a phase whose event is missing is
    left out."""

    def first(prefix: str) -> int | None:
        stamps = [e["created_at"] for e in events if e["message"].startswith(prefix)]
        return min(stamps) if stamps else None

    steps = [e["created_at"] for e in events if e["message"].startswith("Step ")]
    marks = [
        ("queued until the training child started", first("Training process started")),
        ("validating the training file", first("Training file validated")),
        ("loading the model, building the trainer", first("Training dpo")),
        ("up to the first logged step", steps[0] if steps else None),
        ("steps", steps[-1] if steps else None),
        ("saving, until finished", finished),
    ]
    out, last = [], created
    for name, stamp in marks:
        if stamp is not None:
            out.append((name, stamp - last))
            last = stamp
    return out


def train_runtime(events: list[dict]) -> float | None:
    """The trainer's own `train_runtime` (seconds), logged with its last step."""
    runtimes = [(e.get("data") or {}).get("train_runtime") for e in events]
    runtimes = [r for r in runtimes if r is not None]
    return float(runtimes[-1]) if runtimes else None


def run_job(client, pairs: int, epochs: int) -> tuple[object, list[dict]]:
    text = "".join(json.dumps(row) + "\n" for row in verifier_pairs(pairs))
    upload = client.files.create(file=("dpo.jsonl", io.BytesIO(text.encode())), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=EMBEDDED_MODEL_NAME,
        training_file=upload.id,
        method={"type": "dpo", "dpo": {"hyperparameters": {"n_epochs": epochs, "batch_size": 1}}},
        suffix="bench",
        seed=1,
        extra_body={
            "nip_training": {
                "lora_rank": 16,
                "lora_alpha": 32.0,
                "learning_rate": 6e-4,
                "rpo_alpha": 0.2,
                "gradient_accumulation_steps": 2,
                "shuffle": False,
                "activation_checkpointing": False,
            }
        },
    )
    while job.status not in ("succeeded", "failed", "cancelled"):
        time.sleep(1)
        job = client.fine_tuning.jobs.retrieve(job.id)
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=10_000))
    events.sort(key=lambda e: e.created_at)  # the API lists newest first
    return job, [e.model_dump() for e in events]


def median_step(events: list[dict]) -> float | None:
    """The median of the job's timed optimizer steps after the first (warm-up)."""
    seconds = step_seconds(events)
    return statistics.median(seconds[1:] or seconds) if seconds else None


def serve_and_train(
    args: argparse.Namespace, engine: str, flags: list[str]
) -> tuple[float, float | None]:
    """Start our server on `engine`, run the job, print its phases and the fine-tuned model's
    first answers; (the seconds from creating the job to that first answer, the median step)."""
    import openai

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
        command = [sys.executable, "-m", "nip_core.lm_server", "--engine", engine, *flags]
        command += ["--port", str(port), "--vllm-port", str(_free_port()), "--state-dir", state]
        proc = subprocess.Popen(command, env=env)
        try:
            _wait_up(url, proc, 1800)
            chats = [e["input"]["messages"] for e in verifier_pairs(16)]
            asyncio.run(_send_all(url, chats[:1], 1, 8))  # the base model serving, as in rollouts
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            job, events = run_job(client, args.pairs, args.epochs)
            if job.status != "succeeded":
                raise SystemExit(f"the job ended {job.status}: {job.error}")
            device = next(
                (e["data"]["device"] for e in events if "device" in (e["data"] or {})), "?"
            )
            wall = job.finished_at - job.created_at
            print(f"{engine} {' '.join(flags)}")
            print(f"DPO job on {device}: {args.pairs} pairs x {args.epochs} epochs, {wall} s")
            for name, seconds in phases(job.created_at, job.finished_at, events):
                print(f"  {name:42s} {seconds:5d} s")
            step = median_step(events)
            if step is not None:
                print(f"median optimizer step (after the first): {step:.2f} s")
            asyncio.run(_send_all(url, chats[:1], 1, 8, job.fine_tuned_model))
            to_first_answer = time.time() - job.created_at
            print(f"job created -> first answer from the fine-tuned model: {to_first_answer:.1f} s")
            started = time.perf_counter()
            asyncio.run(_send_all(url, chats, 1, 32, job.fine_tuned_model))
            print(f"16 answers at once from it: {time.perf_counter() - started:.1f} s")
            runtime = train_runtime(events)
            if runtime is None:
                raise SystemExit("the job logged no train_runtime")
            print(f"trainer's train_runtime {runtime:.1f} s of the job's {wall} s")
            print(f"ratio train_steps/job_wall: {runtime / max(wall, 1):.2f}")
            return to_first_answer, step
        finally:
            proc.terminate()
            proc.wait(timeout=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--engine", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--compare-serve-during-training", action="store_true")
    args = parser.parse_args(argv)
    if not args.compare_serve_during_training:
        serve_and_train(args, args.engine, [])
        return
    stopped, stopped_step = serve_and_train(args, "vllm", [])
    serving, serving_step = serve_and_train(args, "vllm", ["--vllm-serve-during-training"])
    if stopped_step and serving_step:  # does vLLM idle beside the job slow its steps?
        print(f"ratio step serving/stopped: {serving_step / stopped_step:.2f}")
    print(f"ratio serving/stopped: {serving / stopped:.2f}")


if __name__ == "__main__":
    main()
