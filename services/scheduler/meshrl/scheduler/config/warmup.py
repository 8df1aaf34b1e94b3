"""The `warmup` section: the supervised phase before RL and its rules. Part of `JobConfig`
(meshrl.scheduler.config); run by meshrl.scheduler.step.job.warmup."""

from __future__ import annotations

from typing import Literal

import pydantic

from meshrl.common.config import StrictModel

Field = pydantic.Field

# The ramp in front of a decaying warm-up (bench/vs_trl/README.md, "Issue 41: the warm-up's lr ramp"): on `add`
# 0.03-0.2 helped less, 0.3 less than 0.5 in each of five seeds.
DECAY_RAMP_RATIO = 0.5


class WarmupSection(StrictModel):
    """Supervised warm-up on (prompt, response) pairs before RL (a job phase, run once;
    meshrl.scheduler.step.job.warmup).

    The defaults are what bench/vs_trl measured: lr ramped linearly to its peak over the first half of the steps,
    then decayed linearly to min_lr (a triangle), and a fresh optimizer for RL. On its `add` task (400 steps) the
    ramp made the warm-up cross the task's transition in most data orders (held-out accuracy over 5 seeds x 8
    orders 0.84 against 0.42 without a ramp, TRL's SFTTrainer default)."""

    steps: int = Field(0, ge=0, description="optimizer steps (0 with epochs 0: no warm-up)")
    epochs: float = Field(0.0, ge=0, description="passes over data.train instead of steps (set one of the two)")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-3, gt=0, description="peak learning rate")
    schedule: Literal["constant", "linear", "cosine"] = Field("linear", description="decay after the ramp")
    warmup_ratio: float | None = Field(
        None,
        ge=0,
        le=1,
        description="share of the steps with a linear lr ramp to `lr`; unset: 0.5 before a linear or cosine "
        "decay, none before a constant rate (the examples' tuned constant recipes)",
    )
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

    @property
    def ramp_ratio(self) -> float:
        """The share of the steps ramping up to `lr`: `warmup_ratio`, or its default for this schedule."""
        if self.warmup_ratio is not None:
            return self.warmup_ratio
        return 0.0 if self.schedule == "constant" else DECAY_RAMP_RATIO

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> WarmupSection:
        if self.steps and self.epochs:
            raise ValueError(f"warmup.steps = {self.steps} and warmup.epochs = {self.epochs}: set only one of them")
        if self.min_lr > self.lr:
            raise ValueError(f"warmup.min_lr = {self.min_lr} is above warmup.lr = {self.lr}; use a value <= lr")
        return self
