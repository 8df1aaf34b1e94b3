"""Optimizer, learning-rate schedule and data-parallel gradient reduction for trainable roles.

AdamW (torch) over the megatron-core model's parameters; LR warmup then constant / linear / cosine
decay to min_lr; gradients summed across data-parallel ranks with one flat all-reduce (gloo on CPU,
NCCL on GPU). `OptimizerConfig` is the one definition of the optimizer settings. Called by `meshrl.trainer.core`.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import pydantic
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from meshrl.common.config import Settings
from meshrl.common.errors import ConfigError

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

    @pydantic.model_validator(mode="after")
    def _min_below_peak(self) -> OptimizerConfig:
        if self.min_lr > self.lr:
            raise ConfigError("optimizer.min_lr", self.min_lr, f"is above lr = {self.lr}", "use 0 or a value below lr")
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


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; no weight decay on norms and biases (1-D tensors)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(
        groups, lr=lr_at(cfg, 0), betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, foreach=False
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def allreduce_grads(params: list[torch.nn.Parameter]) -> None:
    """Sums each parameter's gradient over the data-parallel world (a no-op with one rank).

    Losses are already divided by the global token / sequence count, so the sum is the full-batch gradient.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    for p, reduced in zip(params, _unflatten_dense_tensors(flat, grads), strict=True):
        if p.grad is None:
            p.grad = reduced.clone()
        else:
            p.grad.copy_(reduced)


def grad_norm(params: list[torch.nn.Parameter]) -> float:
    """Global L2 norm of the gradients (inf/nan propagate)."""
    norms = [p.grad.detach().float().norm(2) for p in params if p.grad is not None]
    if not norms:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack(norms), 2))
