"""Playing episodes: the one place that builds chat clients, settings and grows trees.

`episodes` builds the clients (one per endpoint, each with its call journal) and the rollout or
evaluation settings and plays a batch to the end; `rollout_stage` and `evaluation_stage` are the
stages that use it (shards, checkpoints, manifest). The switch guard
(`nip_core.training.switch_guard_stage`) and the experiment (`nip_core.experiment.arm_results`)
play through `episodes` as well, so every model call of a run goes through one path.
"""
