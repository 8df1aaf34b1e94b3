"""Optimizer, learning-rate schedule and gradient reduction of trainable roles: Megatron's own.

A trainable model is wrapped in megatron-core's `DistributedDataParallel` (grads accumulate in fp32 buckets,
reduced over the data-parallel group; overlapped with backward on CUDA) and stepped by `get_megatron_optimizer`
(Adam or SGD; fp32 master weights under bf16; the distributed optimizer shards its state over data-parallel
ranks when asked). Gradients are summed, never averaged: losses arrive normalised by the global token count.
LR warmup then constant / linear / cosine decay to min_lr. `OptimizerConfig` mirrors
`meshrl.trainer.v1.OptimizerConfig`. Called by `meshrl.trainer.core` and `meshrl.trainer.training`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from megatron.core import optimizer as mcore_optim
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

from meshrl.common.errors import ConfigError
from meshrl.trainer import megatron_compat

DECAY_STYLES = ("constant", "linear", "cosine")
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 1e-6
    min_lr: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0  # max global grad norm (0 = no clipping)
    warmup_steps: int = 0
    decay_steps: int = 0  # 0 = constant after warmup
    decay_style: str = "constant"
    name: str = "adam"  # "adam" (AdamW) | "sgd" (no momentum: makes layout comparisons sharp)
    distributed: bool = False  # shard optimizer state over data-parallel ranks (Megatron's distributed optimizer)

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ConfigError("optimizer.name", self.name, "unknown", f"use one of {OPTIMIZERS}")
        if self.distributed and self.name != "adam":
            raise ConfigError("optimizer.distributed", True, f"Megatron's distributed optimizer needs adam, not "
                              f"{self.name!r}", "use name=adam or distributed=false")  # fmt: skip
        if self.lr <= 0:
            raise ConfigError("optimizer.lr", self.lr, "must be positive", "use e.g. 1e-6")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError("optimizer.min_lr", self.min_lr, "must be in [0, lr]", "use 0 or a value below lr")
        if self.decay_style not in DECAY_STYLES:
            raise ConfigError("optimizer.decay_style", self.decay_style, "unknown", f"use one of {DECAY_STYLES}")
        for name in ("warmup_steps", "decay_steps", "clip_grad", "weight_decay", "adam_eps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"optimizer.{name}", getattr(self, name), "must be >= 0", "use a non-negative value")
        if not (0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1):
            raise ConfigError(
                "optimizer.adam_beta1/2", (self.adam_beta1, self.adam_beta2), "must be in [0, 1)", "use 0.9 / 0.999"
            )


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
