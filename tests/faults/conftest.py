"""Fixtures of the fault-injection suite: a tiny model and task, and finding a job's service processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # _inject.py


@pytest.fixture(scope="session")
def tiny_task(tmp_path_factory) -> dict:
    from meshrl.trainer.model_builder import build_small_model

    root = tmp_path_factory.mktemp("faults")
    model = build_small_model(root / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(64)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    return {"model": str(model), "train": str(root / "train.jsonl"), "eval": str(root / "eval.jsonl")}
