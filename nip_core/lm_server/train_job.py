"""Entry point of one training child: `python -m nip_core.lm_server.train_job <job_dir>`.

Reads `config.json` (written by the server), validates the training file, trains (or, for the
dummy engine, fakes training) and writes `status.json` plus events for the server to poll. It runs
in its own process group so that a crash or a cancel (SIGTERM to the group) never hurts the server.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

from nip_core.lm_server.datasets import DatasetError, parse_dataset
from nip_core.lm_server.options import OptionsError, TrainingOptions
from nip_core.lm_server.precision import training_precision
from nip_core.lm_server.store import append_event, read_state_json, write_json_atomic


def _status(job_dir: Path, status: str, **extra) -> None:
    write_json_atomic(job_dir / "status.json", {"status": status, **extra})


def _fake_train(output: Path, seconds: float) -> str:
    """Pretend to train: wait, then write an adapter dir with a marker config."""
    time.sleep(seconds)
    output.mkdir(parents=True, exist_ok=True)
    (output / "adapter_config.json").write_text('{"fake": true}\n')
    return "lora"


def _event_callback(job_dir: Path):
    from transformers import TrainerCallback

    class Events(TrainerCallback):
        """Forward the trainer's log lines (loss, rewards, …) as job events, each step's with
        its wall seconds (`step_seconds`: from the previous step's end, or the start of
        training, to this one's), which `bench/dpo_roofline.py` divides the step's work by."""

        def __init__(self) -> None:
            self.mark: float | None = None
            self.step_seconds: float | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.mark = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            if self.mark is not None:
                self.step_seconds = now - self.mark
            self.mark = now

        def on_log(self, args, state, control, logs=None, **kwargs):
            metrics = {k: v for k, v in (logs or {}).items() if isinstance(v, int | float)}
            if self.step_seconds is not None and "train_runtime" not in metrics:
                metrics["step_seconds"] = round(self.step_seconds, 4)
                self.step_seconds = None
            shown = ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if "loss" in k)
            message = f"Step {state.global_step}/{state.max_steps}: {shown or 'logged'}"
            append_event(job_dir, message, data={"step": state.global_step, **metrics})

    return Events()


def _train(job_dir: Path, config: dict, options: TrainingOptions, rows: list[dict]):
    """Train for real; returns (result kind, trained tokens or None)."""
    from nip_core.lm_server import dataset_stats, training

    parent = config.get("parent_adapter")
    model, peft_config, strategy = training.load_for_training(config["base_model"], parent, options)
    tokenizer_path = (
        parent["path"]
        if parent and Path(parent["path"], "tokenizer_config.json").exists()
        else config["base_model"]
    )
    tokenizer = training.load_tokenizer(tokenizer_path)
    output = Path(config["output_dir"])
    callbacks = [_event_callback(job_dir)]
    if options.stop_at_pair_accuracy is not None:
        from nip_core.lm_server.early_stop import stop_when_fitted_callback

        def report(message: str, data: dict) -> None:
            append_event(job_dir, message, data=data)

        callbacks.append(stop_when_fitted_callback(options.stop_at_pair_accuracy, report))
    trainer = training.build_trainer(
        options,
        model,
        tokenizer,
        rows,
        str(job_dir / "trainer"),
        peft_config,
        callbacks=callbacks,
    )
    device = str(trainer.args.device)  # where the steps run: "cpu", "cuda:0"
    precision, why = training_precision(options)
    append_event(
        job_dir,
        f"Training {options.method} ({strategy} adapter) on {len(rows)} examples on {device}, "
        f"frozen weights in {precision} ({why}; LoRA weights and optimizer state in fp32)",
        data={"device": device, "precision": precision},
    )
    stats = dataset_stats.trainer_dataset_event(trainer, rows, options.method)
    if stats is not None:
        append_event(job_dir, dataset_stats.dataset_summary_line(stats), data=stats)
    trainer.train()
    tokens = [e["num_tokens"] for e in trainer.state.log_history if "num_tokens" in e]
    kind = training.save_result(trainer, tokenizer, output, strategy, parent)
    return kind, int(tokens[-1]) if tokens else None


def run(job_dir: Path) -> int:
    """Run the job described in `job_dir`; the outcome goes to status.json, never an exception."""
    config = read_state_json(job_dir / "config.json")
    _status(job_dir, "validating_files")
    try:
        options = TrainingOptions.from_dict(config["options"])
        text = Path(config["training_file"]).read_text(encoding="utf-8")
        rows = parse_dataset(text, options.method)
        if options.quantization != "none":
            from nip_core.lm_server.training import check_runtime

            check_runtime(options)
        _status(job_dir, "running")
        append_event(job_dir, f"Training file validated: {len(rows)} examples")
        output = Path(config["output_dir"])
        if config.get("fake"):
            kind, tokens = _fake_train(output, float(config.get("fake_seconds", 0))), None
        else:
            kind, tokens = _train(job_dir, config, options, rows)
    except DatasetError as exc:
        return _fail(
            job_dir, "invalid_training_file", f"invalid training file: {exc}", "training_file"
        )
    except OptionsError as exc:
        return _fail(job_dir, "invalid_training_config", str(exc), exc.param)
    except Exception as exc:
        traceback.print_exc()
        return _fail(job_dir, "training_failed", f"{type(exc).__name__}: {exc}")
    _status(job_dir, "succeeded", kind=kind, trained_tokens=tokens)
    return 0


def _fail(job_dir: Path, code: str, message: str, param: str | None = None) -> int:
    _status(job_dir, "failed", error={"code": code, "message": message, "param": param})
    return 1


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
