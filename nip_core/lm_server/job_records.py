"""A new fine-tuning job's record: the OpenAI job object plus the server's own `_` fields."""

from __future__ import annotations

import time
from pathlib import Path

from nip_core.lm_server.store import new_id


def new_job_record(body: dict, options: dict, metadata: dict, root: str) -> dict:
    """The queued job for a checked create request; `root` is the base model the chain of
    adapters started from, whose short name goes into the fine-tuned model's name."""
    job_id = new_id("ftjob")
    suffix = body.get("suffix") or ""
    return {
        "id": job_id,
        "object": "fine_tuning.job",
        "created_at": int(time.time()),
        "model": body["model"],
        "training_file": body["training_file"],
        "validation_file": None,
        "status": "queued",
        "fine_tuned_model": None,
        "finished_at": None,
        "error": None,
        "hyperparameters": {
            "n_epochs": options["n_epochs"],
            "batch_size": options["batch_size"],
            "learning_rate_multiplier": "auto",
        },
        "method": body.get("method") or {"type": "supervised"},
        "nip_training": options,
        "metadata": metadata,
        "seed": options["seed"],
        "suffix": suffix or None,
        "user_provided_suffix": suffix or None,
        "organization_id": "nip-malt",
        "result_files": [],
        "trained_tokens": None,
        "integrations": [],
        "estimated_finish": None,
        "_new_model_name": f"ft:{Path(root).name}:{suffix}:{job_id}",
        "_root_name": root,
        "_created_ns": time.time_ns(),  # orders jobs created within the same second
    }
