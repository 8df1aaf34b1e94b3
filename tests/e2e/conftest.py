"""Fixtures of the end-to-end tests: a tiny model and task built once, and a job runner that
starts real services (processes or Ray actors) the way `meshrl run` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="session")
def tiny_task(tmp_path_factory) -> dict:
    """A 1-layer model and an 'add one' task: enough to exercise every path quickly."""
    from meshrl.trainer.model_builder import build_small_model

    root = tmp_path_factory.mktemp("e2e")
    model = build_small_model(root / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    data = root / "data"
    data.mkdir()
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(64)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    return {"root": root, "model": str(model), "train": str(data / "train.jsonl"), "eval": str(data / "eval.jsonl")}


def job_config(task: dict, run_root: Path, **sections) -> str:
    cfg = {
        "job": {"name": "e2e", "steps": 2, "run_root": str(run_root)},
        "model": {"path": task["model"]},
        "data": {"train": task["train"], "eval": task["eval"], "prompts_per_step": 4},
        "rollout": {"replicas": 1, "n": 2, "max_tokens": 6},
        "eval": {"every": 0, "max_prompts": 4},
        "services": {"use_ray": False},
        "trainer": {"optimizer": {"lr": 1e-3}},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return yaml.safe_dump(cfg)


def run_job(workflow: str, config: str, resume_dir: str = ""):
    """Runs one job in this process (its services are real processes); returns the finished record."""
    from meshrl.scheduler.jobs import JobManager
    from meshrl.scheduler.workflow import builtin_workflow_text

    jobs = JobManager()
    record = jobs.create(builtin_workflow_text(workflow), config, [], resume_dir=resume_dir)
    jobs.run(record)
    return record
