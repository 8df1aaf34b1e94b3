"""Optimizer, learning-rate schedule and gradient reduction of trainable roles: Megatron's own.

A trainable model is wrapped in megatron-core's `DistributedDataParallel` (grads accumulate in fp32 buckets,
reduced over the data-parallel group; overlapped with backward on CUDA) and stepped by `get_megatron_optimizer`
(Adam or SGD; fp32 master weights under bf16; the distributed optimizer shards its state over data-parallel
ranks when asked). Gradients are summed, never averaged: losses arrive normalised by the global token count.
The settings (`OptimizerConfig`) and the LR schedule (`lr_at`: warmup then constant / linear / cosine decay
to min_lr) live in `meshrl.trainer.optim_config`, which has no megatron import. Called by `meshrl.trainer.core` and `meshrl.trainer.training`.
"""

from __future__ import annotations

import torch
from megatron.core import optimizer as mcore_optim
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

from meshrl.trainer import megatron_compat
from meshrl.trainer.optim_config import OptimizerConfig, lr_at

__all__ = ["OptimizerConfig", "build_optimizer", "lr_at", "set_lr", "wrap_ddp"]


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
