"""The trainer's parallel layout: tensor x pipeline x data parallel ranks over megatron-core's parallel_state.

One trainer process is one rank; the world is tensor_parallel * pipeline_parallel * data_parallel ranks,
grouped by `megatron.core.parallel_state` (tensor-parallel neighbours are consecutive ranks). The same code
runs on gloo (CPU) and NCCL (GPU). Called by `model` (initialisation), `core` (which rows a rank works on,
which ranks hold results) and `sharding` (which slice of a weight a rank holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from megatron.core import parallel_state as ps

from meshrl.common.comm_backend import CommBackend, resolve_backend
from meshrl.common.errors import ConfigError, FailedPrecondition

__all__ = ["Layout", "current_layout", "init_parallel_state"]


@dataclass(frozen=True)
class Layout:
    """This rank's place in the parallel layout (all fields are 1 / 0 in a single process)."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    tp_rank: int = 0
    pp_rank: int = 0
    dp_rank: int = 0

    @property
    def world(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel

    @property
    def model_parallel(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pipeline_parallel - 1

    @property
    def holds_results(self) -> bool:
        """True on the one rank per data-parallel replica whose outputs count (TP rank 0 of the last stage)."""
        return self.tp_rank == 0 and self.last_stage

    def describe(self) -> str:
        return f"TP={self.tensor_parallel} PP={self.pipeline_parallel} DP={self.data_parallel}"


def check_layout(world: int, tensor_parallel: int, pipeline_parallel: int) -> int:
    """Returns the data-parallel size; raises ConfigError unless TP x PP divides the world."""
    for name, value in (
        ("parallel.tensor_parallel", tensor_parallel),
        ("parallel.pipeline_parallel", pipeline_parallel),
    ):
        if value < 1:
            raise ConfigError(name, value, "must be >= 1", "use 1 to disable that kind of parallelism")
    if world % (tensor_parallel * pipeline_parallel):
        raise ConfigError(
            "parallel",
            f"TP={tensor_parallel} x PP={pipeline_parallel}",
            f"does not divide the {world} trainer ranks",
            "make the number of ranks a multiple of tensor_parallel * pipeline_parallel",
        )
    return world // (tensor_parallel * pipeline_parallel)


def init_parallel_state(tensor_parallel: int = 1, pipeline_parallel: int = 1) -> Layout:
    """Initialises megatron-core's groups over the current torch.distributed world (idempotent for the same
    layout). With no process group yet, starts a single-process group (NCCL with CUDA, else gloo: the one
    choice in `comm_backend`), so one process needs no rendezvous.
    """
    if not dist.is_initialized():
        backend = resolve_backend(CommBackend.AUTO, "data_parallel.backend")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    check_layout(dist.get_world_size(), tensor_parallel, pipeline_parallel)
    if ps.model_parallel_is_initialized():
        have = current_layout()
        if (have.tensor_parallel, have.pipeline_parallel) != (tensor_parallel, pipeline_parallel):
            raise FailedPrecondition(
                f"this trainer process runs at {have.describe()}; a model at TP={tensor_parallel} "
                f"PP={pipeline_parallel} needs a trainer started with that layout"
            )
        return have
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tensor_parallel, pipeline_model_parallel_size=pipeline_parallel
    )
    return current_layout()


def current_layout() -> Layout:
    """This rank's layout from the initialised parallel_state."""
    if not ps.model_parallel_is_initialized():
        raise FailedPrecondition("megatron-core parallel state is not initialised; call init_parallel_state() first")
    return Layout(
        tensor_parallel=ps.get_tensor_model_parallel_world_size(),
        pipeline_parallel=ps.get_pipeline_model_parallel_world_size(),
        data_parallel=ps.get_data_parallel_world_size(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        dp_rank=ps.get_data_parallel_rank(),
    )
