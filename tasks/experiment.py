"""Task `experiment-outputs`: `nip_core.experiment.seed_outputs.write_outputs` (experiment.parquet,
summary.parquet, experiment.png and experiment.html; returns the summary).

The rest of an experiment (arms, evaluations, verdict scores, seed files and timings) is
`nip_core.experiment.arm_results` and `seed_outputs`, driven by `flows.experiment`.
"""

from __future__ import annotations

from prefect import task

from nip_core.experiment.seed_outputs import write_outputs

write_outputs_task = task(write_outputs, name="experiment-outputs")
