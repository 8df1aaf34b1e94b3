"""Learning-rate schedules the scheduler computes per optimizer step (the supervised warm-up sends each
step's rate to the trainer as `lr_override`). A linear ramp over `warmup_steps`, then constant, linear or
cosine decay from `peak` to `min_lr` at `total_steps`. Called by `meshrl.scheduler.step.job.warmup`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from meshrl.common.errors import InvalidArgument

Decay = Literal["constant", "linear", "cosine"]


@dataclass(frozen=True)
class LrSchedule:
    peak: float
    total_steps: int
    warmup_steps: int = 0
    decay: Decay = "linear"
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.peak <= 0:
            raise InvalidArgument(f"lr schedule: peak lr {self.peak} must be positive; use e.g. 1e-3")
        if not 0 <= self.min_lr <= self.peak:
            raise InvalidArgument(f"lr schedule: min_lr {self.min_lr} must be in [0, {self.peak}]")
        if self.total_steps < 1 or not 0 <= self.warmup_steps <= self.total_steps:
            raise InvalidArgument(
                f"lr schedule: warmup_steps {self.warmup_steps} must be in [0, total_steps={self.total_steps}]"
                " and total_steps >= 1"
            )
        if self.decay not in ("constant", "linear", "cosine"):
            raise InvalidArgument(f"lr schedule: decay {self.decay!r} unknown; use constant, linear or cosine")

    def at(self, step: int) -> float:
        """The rate of optimizer step `step` (0-based). Linear decay reaches min_lr after the last step, like
        transformers' `get_linear_schedule_with_warmup`: step total_steps-1 still trains at a small rate."""
        if step < self.warmup_steps:
            return self.peak * (step + 1) / self.warmup_steps
        if self.decay == "constant":
            return self.peak
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.decay == "linear":
            return self.min_lr + (self.peak - self.min_lr) * (1.0 - progress)
        return self.min_lr + 0.5 * (self.peak - self.min_lr) * (1.0 + math.cos(math.pi * progress))
