"""The `algorithm` section: advantage estimator, loss (`LossSection`, checked by the one `LossConfig`), reward
and the worker processes of rewards and environments. Part of `JobConfig` (meshrl.scheduler.config)."""

from __future__ import annotations

from typing import Literal

import pydantic

from meshrl.common.config import StrictModel
from meshrl.common.loss_config import LossSection

Field = pydantic.Field

JOB_POLICY_LOSSES = ("ppo", "gspo")  # the actor's RL objectives (sft is the warm-up's, value the critic's)


class AlgorithmSection(StrictModel):
    advantage: Literal["grpo", "grpo_no_std", "rloo", "reinforce_pp", "gae"] = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    loss: LossSection = Field(default_factory=LossSection)
    reward: str = Field("exact_match", description="built-in reward name or package.module:function")
    reward_workers: int = Field(
        0,
        ge=0,
        description="worker processes that score rewards apart from the scheduler, one call per group, "
        "with a timeout and a crash boundary (0: in the scheduler's process, no timeout)",
    )
    reward_timeout_seconds: float = Field(60.0, gt=0, description="per-group reward call limit (reward_workers > 0)")
    reward_retries: int = Field(1, ge=0, description="retries of a group whose reward failed; then it scores 0")
    environment_workers: int = Field(2, ge=1, description="worker processes running a ROLLOUT node's environment")
    environment_timeout_seconds: float = Field(30.0, gt=0, description="limit of one environment reset/step call")
