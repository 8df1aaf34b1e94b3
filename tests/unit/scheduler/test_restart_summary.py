"""A job that restarted its services says so in its summary (and summary.json): how many restarts, how many
steps they redid; restarts stay bounded by job.max_restarts."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from meshrl.common.errors import Unavailable
from meshrl.scheduler.recovery import run_with_restarts


class FakeRun:
    def __init__(self, root: Path) -> None:
        self.summary_file = root / "summary.json"
        self.checkpoint = root / "checkpoints" / "step_000002"

    def latest_checkpoint(self) -> Path:
        return self.checkpoint

    def truncate_after(self, step: int) -> None:
        raise AssertionError("a run with a checkpoint keeps its curves")


class FakeRunner:
    """Fails at step 3 `failures` times (a dead trainer), then finishes 4 steps and writes its summary."""

    def __init__(self, root: Path, failures: int, max_restarts: int) -> None:
        self.cfg = SimpleNamespace(job=SimpleNamespace(max_restarts=max_restarts, restart_backoff_seconds=0))
        self.run, self.failures, self.step, self.logged = FakeRun(root), failures, 0, []
        self.cancelled = threading.Event()
        self.events = SimpleNamespace(log=self.logged.append)

    def run_job(self, resume: bool) -> dict:
        if self.failures:
            self.failures -= 1
            self.step = 3
            raise Unavailable("trainer rank 1 on 127.0.0.3 lost its Ray actor")
        summary = {"steps": 4, "seconds": 1.0}
        self.run.summary_file.write_text(json.dumps({**summary, "report": "report.html"}))
        return summary


def _record(runner: FakeRunner) -> SimpleNamespace:
    return SimpleNamespace(runner=runner, restarts=0, steps_lost=0)


def test_restarts_and_the_steps_they_redid_are_in_the_summary(tmp_path):
    record = _record(FakeRunner(tmp_path, failures=2, max_restarts=3))
    summary = run_with_restarts(record, resume=False)
    assert (summary["restarts"], summary["steps_lost"]) == (2, 2)  # each failed at step 3, back to step 2
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written == {"steps": 4, "seconds": 1.0, "report": "report.html", "restarts": 2, "steps_lost": 2}
    assert [e.split(":")[0] for e in record.runner.logged] == ["restart 1/3", "restart 2/3"]


def test_a_job_without_restarts_keeps_its_summary(tmp_path):
    record = _record(FakeRunner(tmp_path, failures=0, max_restarts=3))
    assert run_with_restarts(record, resume=False) == {"steps": 4, "seconds": 1.0}


def test_restarts_are_bounded(tmp_path):
    record = _record(FakeRunner(tmp_path, failures=3, max_restarts=2))
    with pytest.raises(Unavailable, match="lost its Ray actor"):
        run_with_restarts(record, resume=False)
    assert record.restarts == 2
