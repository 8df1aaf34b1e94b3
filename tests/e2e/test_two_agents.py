"""A two-agent job (examples/hint_solve's workflow) through the real services: the hinter and the solver each
have their own trainer, replicas and weight version; they generate in turn (the solver reads the hinter's
tokens), each is rewarded by its own rule, both weight versions advance and both rewards are logged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.jobs import JobManager

from .conftest import job_config

WORKFLOW = (Path(__file__).resolve().parents[2] / "examples" / "hint_solve" / "workflow.yaml").read_text()
SECTIONS = {"job": {"allowed_modules": ["meshrl", "examples.hint_solve"]}, "data": {"eval": None}}


def test_two_agents_train_in_turn_with_their_own_weights(tiny_task, tmp_path):
    jobs = JobManager()
    record = jobs.create(WORKFLOW, job_config(tiny_task, tmp_path, **SECTIONS), [])
    jobs.run(record)
    assert record.state == spb.JOB_STATE_SUCCEEDED, record.error
    run = record.runner.run
    steps = [json.loads(line) for line in run.metrics_file.read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    for agent in ("hinter", "solver"):
        # version 1 is each agent's initial publication; every step adds one, verified on its replicas
        assert [m[f"{agent}/weights/version"] for m in steps] == [2, 3]
        assert all(m[f"{agent}/weights/stale_replicas"] == 0 for m in steps)
        assert all(math.isfinite(m[f"{agent}/reward/mean"]) for m in steps)
        assert all(math.isfinite(m[f"{agent}/actor/loss"]) for m in steps)
        versions = sorted(p.name for p in (run.weights / agent).iterdir() if p.name.startswith("v"))
        assert versions[-1] == "v000003"
    # in turn: 4 prompts x 2 hinter samples, then 2 solver samples for each hinter sample
    assert steps[-1]["hinter/rollout/samples"] == 8 and steps[-1]["solver/rollout/samples"] == 16
    # own weights: after training on different samples the two agents' published policies differ
    from safetensors.numpy import load_file

    hinter, solver = (load_file(run.weights / a / "v000003" / "model.safetensors") for a in ("hinter", "solver"))
    assert any(not np.array_equal(hinter[k], solver[k]) for k in hinter)
    summary = json.loads(run.summary_file.read_text())
    assert summary["weight_versions"] == {"hinter": 3, "solver": 3}


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({"training": {"mode": "one_step_off"}}, "does not support training.mode"),
        ({"checkpoint": {"every": 1}}, "does not support checkpoints"),
        ({"data": {"eval": "x.jsonl"}}, "does not support a held-out evaluation"),
        ({"services": {"placement": "colocated", "use_ray": True}}, "does not support services.placement"),
    ],
    ids=["async", "checkpoints", "eval", "colocated"],
)
def test_a_two_agent_job_refuses_what_it_does_not_support(tiny_task, tmp_path, sections, expected):
    merged = {k: {**SECTIONS.get(k, {}), **v} for k, v in {**SECTIONS, **sections}.items()}
    with pytest.raises(InvalidArgument, match=expected):
        JobManager(str(tmp_path / "runs"), 1).create(WORKFLOW, job_config(tiny_task, tmp_path, **merged), [])
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_a_model_node_without_an_agent_is_refused(tiny_task, tmp_path):
    doc = yaml.safe_load(WORKFLOW)
    del next(n for n in doc["nodes"] if n["node_id"] == "solver_logprob")["config"]["agent"]
    with pytest.raises(Exception, match="needs config.agent on every ROLLOUT and MODEL_"):
        JobManager(str(tmp_path), 1).create(yaml.safe_dump(doc), job_config(tiny_task, tmp_path, **SECTIONS), [])
