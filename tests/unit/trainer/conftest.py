"""Shared fixtures of the trainer unit tests: tiny model directories built once per session."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from meshrl.api.trainer.v1 import trainer_pb2_grpc
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.scheduler.launch.process import ServiceProcess
from meshrl.trainer.model_builder import build_small_model

sys.path.insert(0, str(Path(__file__).parent))  # the tests share _worker.py (also run as a subprocess)

REDIS_URL = os.environ.get("MESHRL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2-style: qkv bias, tied embeddings, GQA 4 heads / 2 kv heads, hidden 32."""
    return build_small_model(tmp_path_factory.mktemp("qwen2"), arch="qwen2", hidden_size=32, seed=1)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama-style: no biases, untied embeddings, rope theta 500000."""
    return build_small_model(
        tmp_path_factory.mktemp("llama"), arch="llama", hidden_size=32, rope_theta=500000.0, seed=2
    )


@pytest.fixture()
def two_rank_trainer(tmp_path: Path) -> Iterator[SimpleNamespace]:
    """The trainer as deployed: `python -m meshrl.trainer` with 2 data-parallel ranks on a real data buffer
    (`python -m meshrl.databuffer` on the local Redis, its own key prefix). Yields stub, buffer and the trainer's
    process; the trainer and its rank-1 worker must stop cleanly."""
    prefix = f"mtrainer{uuid.uuid4().hex[:8]}"
    buffer_proc = ServiceProcess(
        "databuffer",
        ["--set", f"redis.url={REDIS_URL}", "--set", f"redis.key_prefix={prefix}"],
        str(tmp_path / "databuffer.log"),
    )
    started = [buffer_proc]
    try:
        buffer_address = buffer_proc.start(timeout=180)
        trainer_proc = ServiceProcess(
            "trainer",
            [
                "--set",
                f"databuffer_address={buffer_address}",
                "--set",
                "data_parallel.size=2",
                "--set",
                "torch_threads=1",
                "--set",
                "databuffer_wait_seconds=0",
                "--set",
                f"paths.roots=[{json.dumps(str(tmp_path.parent))}]",
            ],  # the session's temp folders
            str(tmp_path / "trainer.log"),
        )
        started.append(trainer_proc)
        channel = grpc.insecure_channel(trainer_proc.start(timeout=180))
        buffer = DataBufferClient(buffer_address)
        yield SimpleNamespace(stub=trainer_pb2_grpc.TrainerStub(channel), buffer=buffer, proc=trainer_proc)
        buffer.delete_job("job")
        buffer.close()
        channel.close()
    finally:
        codes = [p.stop(grace=30) for p in reversed(started)]
    assert codes[0] == 0, trainer_proc.log_path.read_text()[-3000:]
