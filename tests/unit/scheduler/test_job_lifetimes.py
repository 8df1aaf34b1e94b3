"""What the scheduler keeps of its jobs: ended jobs beyond `keep_finished` are forgotten (their event logs no
longer held in memory; their run folders stay), and a resume cannot name the folder of a job still running."""

from __future__ import annotations

import pytest
import yaml

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.common.errors import FailedPrecondition, NotFound
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.workflow import builtin_workflow_text

GRPO = builtin_workflow_text("grpo")


def _failing_config(tmp_path) -> str:
    """A job that ends at once (its model folder does not exist), without starting any service."""
    return yaml.safe_dump(
        {
            "job": {"name": "f", "max_restarts": 0},
            "model": {"path": str(tmp_path / "none")},
            "data": {"train": str(tmp_path / "t.jsonl")},
        }
    )


def test_ended_jobs_beyond_the_bound_are_forgotten_and_their_folders_stay(tmp_path):
    jobs = JobManager(run_root=str(tmp_path / "runs"), keep_finished=2)
    for name in ("j1", "j2", "j3", "j4"):
        record = jobs.create(GRPO, _failing_config(tmp_path), [], job_id=name)
        jobs.run(record)
        assert record.state == spb.JOB_STATE_FAILED
    assert sorted(jobs.jobs) == ["j3", "j4"]
    with pytest.raises(NotFound, match="forgotten"):
        jobs.get("j1")
    assert (tmp_path / "runs" / "j1" / "events.jsonl").is_file()


def test_a_resume_cannot_name_the_folder_of_a_job_that_has_not_ended(tmp_path):
    jobs = JobManager(run_root=str(tmp_path / "runs"))
    held = jobs.create(GRPO, _failing_config(tmp_path), [], job_id="held")  # pending: never started
    with pytest.raises(FailedPrecondition, match="belongs to job held"):
        jobs.create(GRPO, _failing_config(tmp_path), [], job_id="other", resume_dir=str(held.runner.run.root))
    assert sorted(jobs.jobs) == ["held"]
    jobs.run(held)  # ended: its folder may be resumed now
    again = jobs.create(GRPO, _failing_config(tmp_path), [], job_id="again", resume_dir=str(held.runner.run.root))
    assert again.resume and again.runner.run.root == held.runner.run.root
