"""A user reward function (executable_ref) runs in the step; when it raises, the job fails with the
traceback in its events, and the run stays resumable from its last checkpoint."""

import os
from pathlib import Path

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.workflow import builtin_workflow_text

from .conftest import job_config

FLAG = "MESHRL_TEST_REWARD_FAILS_AT_STEP"


def flaky_reward(prompts, responses, answers):
    """Scores 1.0 for a non-empty response, and raises while the flag file names the current call."""
    marker = Path(os.environ[FLAG])
    calls = marker.with_suffix(".calls")
    n = int(calls.read_text()) + 1 if calls.exists() else 1
    calls.write_text(str(n))
    if marker.exists() and n == int(marker.read_text()):
        raise RuntimeError("the reward model is unreachable")
    return [float(bool(r)) for r in responses]


def _run(config: str, resume_dir: str = ""):
    jobs = JobManager()
    record = jobs.create(builtin_workflow_text("grpo"), config, [], resume_dir=resume_dir)
    jobs.run(record)
    return record


def test_failing_reward_fails_the_step_then_the_run_resumes(tiny_task, tmp_path, monkeypatch):
    marker = tmp_path / "fail.at"
    marker.write_text("3")  # calls: step-0 evaluation, step 1, step 2 (raises)
    monkeypatch.setenv(FLAG, str(marker))
    config = job_config(
        tiny_task,
        tmp_path,
        job={"name": "flaky", "steps": 2, "run_root": str(tmp_path), "allowed_modules": ["meshrl", "tests"]},
        algorithm={"reward": "tests.e2e.test_failure_resume:flaky_reward"},
        checkpoint={"every": 1},
    )
    first = _run(config)
    assert first.state == spb.JOB_STATE_FAILED
    assert "RuntimeError: the reward model is unreachable" in first.error
    errors = first.events.errors()
    assert len(errors) == 1 and "Traceback" in errors[0] and "flaky_reward" in errors[0]
    assert first.runner.run.latest_checkpoint().name == "step_000001"

    marker.unlink()  # the reward model is back
    second = _run(config, resume_dir=str(first.runner.run.root))
    assert second.state == spb.JOB_STATE_SUCCEEDED, second.error
    steps = [line for line in second.runner.run.metrics_file.read_text().splitlines()]
    assert len(steps) == 2 and '"step": 2' in steps[1]
