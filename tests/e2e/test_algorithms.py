"""Every built-in algorithm runs a short job through real services: metrics are finite, the
weight version advances on every replica each step, and a resumed run continues at the right step."""

import json
import math

import pytest

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb

from .conftest import job_config, run_job


def metrics_of(record) -> list[dict]:
    return [json.loads(line) for line in record.runner.run.metrics_file.read_text().splitlines()]


@pytest.mark.parametrize(
    "workflow, sections",
    [
        ("grpo", {}),
        ("ppo", {"algorithm": {"advantage": "gae", "lam": 0.95}}),
        ("dapo", {}),
        ("reinforce_pp", {"algorithm": {"advantage": "reinforce_pp"}}),
        ("rloo", {"algorithm": {"advantage": "rloo"}}),
    ],
)
def test_algorithm_runs_through_the_services(tiny_task, tmp_path, workflow, sections):
    record = run_job(
        workflow, job_config(tiny_task, tmp_path, rollout={"replicas": 2, "n": 2, "max_tokens": 6}, **sections)
    )
    assert record.state == spb.JOB_STATE_SUCCEEDED, record.error
    steps = metrics_of(record)
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        bad = {k: v for k, v in m.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, f"non-finite metrics at step {m['step']}: {bad}"
        assert m["weights/stale_replicas"] == 0
        assert m["rollout/samples"] == 8
    # version 1 is the initial publication; every step adds one, verified on every replica
    assert [m["weights/version"] for m in steps] == [2, 3]
    assert steps[-1]["rollout/min_weight_version"] == 2
    if workflow == "ppo":
        assert "critic/vf_loss" in steps[-1]
    summary = json.loads(record.runner.run.summary_file.read_text())
    assert summary["steps"] == 2 and summary["weight_version"] == 3


def test_resume_continues_at_the_next_step(tiny_task, tmp_path):
    first = run_job("grpo", job_config(tiny_task, tmp_path, checkpoint={"every": 1}))
    assert first.state == spb.JOB_STATE_SUCCEEDED, first.error
    run_dir = first.runner.run.root
    config = job_config(tiny_task, tmp_path, job={"name": "e2e", "steps": 3, "run_root": str(tmp_path)})
    second = run_job("grpo", config, resume_dir=str(run_dir))
    assert second.state == spb.JOB_STATE_SUCCEEDED, second.error
    steps = metrics_of(second)
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert steps[-1]["weights/version"] > steps[1]["weights/version"]
    events = second.runner.run.events_file.read_text()
    assert "resumed from" in events and "step_000002" in events


def test_val_only_evaluates_a_checkpoint(tiny_task, tmp_path):
    from meshrl.scheduler.jobs import JobManager
    from meshrl.scheduler.workflow import builtin_workflow_text

    trained = run_job(
        "grpo", job_config(tiny_task, tmp_path, job={"name": "e2e", "steps": 1, "run_root": str(tmp_path)})
    )
    assert trained.state == spb.JOB_STATE_SUCCEEDED, trained.error
    checkpoint = trained.runner.run.latest_checkpoint()
    record = JobManager().create(builtin_workflow_text("grpo"), job_config(tiny_task, tmp_path), [])
    metrics = record.runner.run_eval_only(str(checkpoint))
    assert metrics["eval/prompts"] == 4 and 0.0 <= metrics["eval/accuracy"] <= 1.0
    assert record.runner.step == 1  # the checkpoint's step
