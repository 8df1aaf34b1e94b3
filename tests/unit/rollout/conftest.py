"""Shared fixtures of the rollout unit tests: a tiny model folder and one transformers engine per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshrl.rollout.config import EngineConfig
from meshrl.rollout.transformers_engine import TransformersEngine
from meshrl.trainer.model_builder import build_small_model

sys.path.insert(0, str(Path(__file__).parent))  # the tests share _rollout_fake_servers.py, _rollout_served.py


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2-style, hidden 32, 2 layers, context 96 tokens."""
    return build_small_model(
        tmp_path_factory.mktemp("rollout-model"), hidden_size=32, num_layers=2, max_position_embeddings=96, seed=7
    )


def make_engine(model_dir: Path, **kwargs) -> TransformersEngine:
    return TransformersEngine(EngineConfig(model_path=str(model_dir), **kwargs))


@pytest.fixture
def new_engine():
    """Builds engines that the test may change (weights, pauses); all are shut down afterwards."""
    made: list[TransformersEngine] = []

    def build(path: Path, **kwargs) -> TransformersEngine:
        made.append(make_engine(path, **kwargs))
        return made[-1]

    yield build
    for eng in made:
        eng.shutdown()


@pytest.fixture(scope="session")
def engine(model_dir: Path):
    eng = make_engine(model_dir, max_batch_size=16)
    yield eng
    eng.shutdown()
