"""The `warmup` section: the supervised phase before RL and its rules. Part of `JobConfig`
(meshrl.scheduler.config); run by meshrl.scheduler.step.job.warmup."""

from __future__ import annotations

from typing import Literal

import pydantic

from meshrl.common.config import StrictModel

Field = pydantic.Field


class WarmupSection(StrictModel):
    """Supervised warm-up on (prompt, response) pairs before RL (a job phase, run once;
    meshrl.scheduler.step.job.warmup).

    The defaults are what bench/vs_trl measured against TRL's SFTTrainer: lr decayed linearly to min_lr over
    the phase and a fresh optimizer for RL."""

    steps: int = Field(0, ge=0, description="optimizer steps (0 with epochs 0: no warm-up)")
    epochs: float = Field(0.0, ge=0, description="passes over data.train instead of steps (set one of the two)")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-3, gt=0, description="peak learning rate")
    schedule: Literal["constant", "linear", "cosine"] = Field("linear", description="decay after the ramp")
    warmup_ratio: float = Field(0.0, ge=0, le=1, description="share of the steps with a linear lr ramp")
    min_lr: float = Field(0.0, ge=0, description="the rate the decay ends at")
    eval_every: int = Field(0, ge=0, description="held-out loss every K steps (always at the end)")
    eval_accuracy_every: int = Field(
        0,
        ge=0,
        description="held-out accuracy every K steps (0: only after the warm-up, as RL's step 0): the "
        "actor's weights are published to the replicas and the job's greedy evaluation (`eval`) runs; its time is "
        "left out of the warm-up's seconds",
    )
    handover: Literal["fresh", "keep"] = Field(
        "fresh", description="fresh: RL starts with a new optimizer; keep: RL continues the warm-up's Adam state"
    )
    steps_per_call: int = Field(
        8,
        ge=1,
        description="optimizer steps per trainer call: their batches travel in one buffer put and one "
        "TrainStep that gives each step its own learning rate, so a small step does not pay a call's fixed cost "
        "each time; the same steps, rates and curve as one call per step. Calls end where a held-out evaluation "
        "is due",
    )

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> WarmupSection:
        if self.steps and self.epochs:
            raise ValueError(f"warmup.steps = {self.steps} and warmup.epochs = {self.epochs}: set only one of them")
        if self.min_lr > self.lr:
            raise ValueError(f"warmup.min_lr = {self.min_lr} is above warmup.lr = {self.lr}; use a value <= lr")
        return self
