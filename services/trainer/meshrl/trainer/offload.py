"""Colocated mode's trainer offload: while the rollout replicas generate on the shared device, the trainable
roles' optimizer state (Adam's moments: twice the parameters in fp32) waits in host memory, and comes back
before the trainer's next forward pass.

Called by `TrainerService.offload` / `onload` on every rank (Trainer.Offload / Onload, which the scheduler's
`step.job.colocate.Turns` calls). On CUDA the state moves to pinned host memory and the caching allocator hands the
freed blocks back; on a CPU trainer the state already lives in host memory, so both calls move nothing and say
so (bytes 0). Parameters, gradient buffers and fp32 master weights stay where they are (Megatron's DDP buffers
and the optimizer keep views of them).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch


def torch_optimizers(optimizer: Any) -> Iterator[torch.optim.Optimizer]:
    """The torch optimizers inside a Megatron optimizer (chained, mixed-precision or plain)."""
    for inner in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        base = getattr(inner, "optimizer", inner)
        if isinstance(base, torch.optim.Optimizer):
            yield base


def move_optimizer_state(optimizers: Iterable[Any], device: torch.device) -> int:
    """Moves every tensor of the optimizers' state to `device`; returns the bytes that moved."""
    moved = 0
    pin = device.type == "cpu" and torch.cuda.is_available()
    for optimizer in optimizers:
        for opt in torch_optimizers(optimizer):
            for state in opt.state.values():
                for key, value in state.items():
                    if torch.is_tensor(value) and value.device != device:
                        copy = value.to(device, non_blocking=True)
                        state[key] = copy.pin_memory() if pin else copy
                        moved += value.numel() * value.element_size()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return moved


def set_residency(roles: Iterable[Any], device: torch.device, resident: bool) -> dict[str, Any]:
    """Offloads (resident=False: to host memory) or onloads (to `device`, the trainer's) the optimizer state of
    `roles` (RoleState); returns {"bytes", "seconds", "device"} of the move."""
    start = time.perf_counter()
    target = device if resident else torch.device("cpu")
    moved = move_optimizer_state([r.optimizer for r in roles if r.optimizer is not None], target)
    return {"bytes": moved, "seconds": time.perf_counter() - start, "device": str(target)}
