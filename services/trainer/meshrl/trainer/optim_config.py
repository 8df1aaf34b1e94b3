"""The optimizer settings of a trainable role (`OptimizerConfig`, the one definition of every setting and its
default) and the learning-rate schedule they describe (`lr_at`). Pure config and arithmetic, no torch or
megatron-core: the trainer's config, server and service import it at start-up, before (and without) the heavy
optimizer code in `meshrl.trainer.optim`, which builds Megatron's optimizer from it.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import pydantic

from meshrl.common.config import Settings
from meshrl.common.errors import ConfigError

__all__ = ["OptimizerConfig", "lr_at"]

Field = pydantic.Field


class OptimizerConfig(Settings):
    """How a trainable role is optimised, and the one definition of every optimizer setting and its default.
    The trainer's config (`defaults.optimizer`), `meshrl.trainer.v1.OptimizerConfig` and the job config's
    `trainer.optimizer` carry these fields."""

    section: ClassVar[str] = "optimizer"

    lr: float = Field(1e-5, gt=0, description="peak learning rate, e.g. 1e-5")
    min_lr: float = Field(0.0, ge=0, description="the rate decay ends at (<= lr)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay of matrices (norms and biases get none)")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="a number in [0, 1), e.g. 0.9")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="a number in [0, 1), e.g. 0.999")
    adam_eps: float = Field(1e-8, gt=0, description="a small positive number, e.g. 1e-8")
    clip_grad: float = Field(1.0, ge=0, description="max global grad norm, or 0 for no clipping")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up from 0 to lr")
    decay_steps: int = Field(0, ge=0, description="optimizer steps of decay after warm-up (0 = constant)")
    decay_style: Literal["constant", "linear", "cosine"] = "constant"
    name: Literal["adam", "sgd"] = Field(
        "adam", description="adam (AdamW) or sgd (no momentum: makes layout comparisons sharp)"
    )
    distributed: bool = Field(False, description="Megatron's distributed optimizer: Adam state sharded over DP ranks")

    @pydantic.model_validator(mode="after")
    def _min_below_peak(self) -> OptimizerConfig:
        if self.min_lr > self.lr:
            raise ConfigError("optimizer.min_lr", self.min_lr, f"is above lr = {self.lr}", "use 0 or a value below lr")
        if self.distributed and self.name != "adam":
            raise ConfigError(
                "optimizer.distributed",
                True,
                f"Megatron's distributed optimizer needs adam, not {self.name!r}",
                "use name=adam or distributed=false",
            )
        return self


def lr_at(cfg: OptimizerConfig, step: int) -> float:
    """The learning rate of optimizer step `step` (0-based): linear warmup to lr over warmup_steps, then
    decay to min_lr over decay_steps (constant after), or constant lr when decay_steps is 0."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if not cfg.decay_steps or cfg.decay_style == "constant":
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup_steps) / cfg.decay_steps)
    if cfg.decay_style == "linear":
        return cfg.lr - (cfg.lr - cfg.min_lr) * progress
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))
