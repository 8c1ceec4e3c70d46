"""Task `estimate-rewards`: `nip_core.malt.rewards_stage.estimate_rewards` (nodes file in,
rewards file out)."""

from __future__ import annotations

from prefect import task

from nip_core.malt.rewards_stage import estimate_rewards

estimate_rewards_task = task(estimate_rewards, name="estimate-rewards")
