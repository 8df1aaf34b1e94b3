"""Optimizer, learning-rate schedule and gradient reduction of trainable roles: Megatron's own.

A trainable model is wrapped in megatron-core's `DistributedDataParallel` (grads accumulate in fp32 buckets,
reduced over the data-parallel group; overlapped with backward on CUDA) and stepped by `get_megatron_optimizer`
(Adam or SGD; fp32 master weights under bf16; the distributed optimizer shards its state over data-parallel
ranks when asked). Gradients are summed, never averaged: losses arrive normalised by the global token count.
LR warmup then constant / linear / cosine decay to min_lr. `OptimizerConfig` is the one definition of the
optimizer settings. Called by `meshrl.trainer.core` and `meshrl.trainer.training`.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import pydantic
import torch
from megatron.core import optimizer as mcore_optim
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

from meshrl.common.config import Settings
from meshrl.common.errors import ConfigError
from meshrl.trainer import megatron_compat

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
            raise ConfigError("optimizer.distributed", True, f"Megatron's distributed optimizer needs adam, not "
                              f"{self.name!r}", "use name=adam or distributed=false")  # fmt: skip
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


def wrap_ddp(model: torch.nn.Module, *, distributed: bool) -> DistributedDataParallel:
    """Megatron DDP around `model`: fp32 grad buckets, summed over data-parallel ranks at the end of backward."""
    config = model.config
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=torch.cuda.is_available(),
        use_distributed_optimizer=distributed,
        bucket_size=40_000_000 if torch.cuda.is_available() else None,
    )
    with megatron_compat.cpu_devices():
        ddp = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    config.no_sync_func = ddp.no_sync
    # Summed losses: skip finalize_model_grads' division by the token count the schedules report.
    config.finalize_model_grads_func = lambda chunks, _num_tokens=None, **kw: finalize_model_grads(chunks, None, **kw)
    return ddp


def build_optimizer(ddp: DistributedDataParallel, cfg: OptimizerConfig, dtype: torch.dtype):
    """`get_megatron_optimizer` over the DDP-wrapped model (no weight decay on norms and biases)."""
    mcfg = mcore_optim.OptimizerConfig(
        optimizer=cfg.name,
        lr=lr_at(cfg, 0),
        min_lr=cfg.min_lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_beta1,
        adam_beta2=cfg.adam_beta2,
        adam_eps=cfg.adam_eps,
        sgd_momentum=0.0,
        clip_grad=cfg.clip_grad,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        params_dtype=dtype,
        use_distributed_optimizer=cfg.distributed,
    )
    with megatron_compat.cpu_devices():
        return mcore_optim.get_megatron_optimizer(mcfg, [ddp])


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
