"""Shared fixtures of the trainer unit tests: tiny model directories built once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshrl.trainer.model_builder import build_small_model

sys.path.insert(0, str(Path(__file__).parent))  # the tests share _worker.py (also run as a subprocess)


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
