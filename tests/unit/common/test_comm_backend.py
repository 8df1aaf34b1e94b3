"""The one backend choice (meshrl.common.comm_backend): NCCL on CUDA ranks, gloo otherwise; nccl asked
for without CUDA is a ConfigError naming the field, at config load and when the scheduler resolves it."""

from __future__ import annotations

import pytest
import torch

from meshrl.common.comm_backend import CommBackend, resolve_backend
from meshrl.common.errors import ConfigError
from meshrl.trainer.config import DataParallelConfig

NO_CUDA = not torch.cuda.is_available()


def test_auto_follows_the_devices():
    assert resolve_backend("auto", "weights.backend", ["cuda:0", "cuda:1"]) == "nccl"
    assert resolve_backend(CommBackend.AUTO, "weights.backend", ["cuda:0", "cpu"]) == "gloo"
    assert resolve_backend("gloo", "weights.backend", ["cuda:0"]) == "gloo"
    with pytest.raises(ConfigError, match="weights.backend.*nccl.*cpu.*auto"):
        resolve_backend("nccl", "weights.backend", ["cuda:0", "cpu"])
    with pytest.raises(ConfigError, match="weights.backend.*one of auto, nccl, gloo"):
        resolve_backend("mpi", "weights.backend", ["cpu"])


@pytest.mark.skipif(not NO_CUDA, reason="checks the CPU-only choice")
def test_without_cuda_auto_is_gloo_and_nccl_fails_at_load():
    assert DataParallelConfig().resolved_backend() == "gloo"
    with pytest.raises(ConfigError, match="data_parallel.backend"):
        DataParallelConfig(backend="nccl")
