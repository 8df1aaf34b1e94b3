"""Recovery without a person: a job whose service died restarts its services and resumes from its last
checkpoint (at most `job.max_restarts` times), and a scheduler that restarts picks up the jobs that were
running in its run root.

`JobManager.run` calls `run_with_restarts`; `python -m meshrl.scheduler` calls `unfinished_runs` on start.
Steps since the last checkpoint are redone (`checkpoint.every` bounds them); samples the data buffer
acknowledged stay in Redis (append-only file) across a restart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.common.errors import (
    MODEL_NOT_LOADED,
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    MeshrlError,
    Unavailable,
)

# a peer that went away (killed, restarting, unreachable): the job restarts its services
RESTARTABLE = (Unavailable, DeadlineExceeded, Aborted)
TERMINAL_NAMES = {
    spb.JobState.Name(s) for s in (spb.JOB_STATE_SUCCEEDED, spb.JOB_STATE_FAILED, spb.JOB_STATE_CANCELLED)
}
# Typed reasons (`MeshrlError.reason`, sent beside the status) of a service that restarted and lost its state:
# a trainer that forgot its models was restarted (by a supervisor) while a call was being retried to it.
LOST_STATE = (MODEL_NOT_LOADED,)


def restartable(exc: BaseException) -> bool:
    """A dead or unreachable service, or one that restarted and lost its state (not bad input, not a user
    function's error, not a cancel)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, RESTARTABLE):
            return True
        if isinstance(exc, FailedPrecondition) and exc.reason in LOST_STATE:
            return True
        if isinstance(exc, MeshrlError):
            return False
        exc = exc.__cause__ or exc.__context__
    return False


def run_with_restarts(record, resume: bool) -> dict:
    """Runs the record's job; after a dead service, restarts the job's services and resumes from the last
    checkpoint, up to job.max_restarts times (`record.restarts` counts them, events say why)."""
    runner = record.runner
    limit = runner.cfg.job.max_restarts
    while True:
        try:
            return _with_restarts(record, runner.run_job(resume=resume))
        except Exception as exc:
            if not restartable(exc) or record.restarts >= limit or runner.cancelled.is_set():
                raise
            failed_at = runner.step
            record.restarts += 1
            latest = runner.run.latest_checkpoint()
            back_to = int(latest.name.rsplit("_", 1)[-1]) if latest is not None else 0
            record.steps_lost += max(failed_at - back_to, 0)
            runner.events.log(
                f"restart {record.restarts}/{limit}: {type(exc).__name__} at step {failed_at}: {str(exc)[:300]}; "
                f"restarting the services and resuming from step {back_to}"
            )
            runner.step = 0
            if latest is None:
                runner.run.truncate_after(0)  # a fresh start: the curves restart with it
            resume = True
            time.sleep(runner.cfg.job.restart_backoff_seconds)


def _with_restarts(record, summary: dict) -> dict:
    """The job's summary (and its summary.json) with the restarts it took and the steps they redid."""
    if record.restarts:
        summary.update(restarts=record.restarts, steps_lost=record.steps_lost)
        path = record.runner.run.summary_file
        if path.exists():
            path.write_text(json.dumps({**json.loads(path.read_text()), **summary}, indent=2))
    return summary


def _last_state(events_file: Path) -> str | None:
    state = None
    with open(events_file) as f:
        for line in f:
            if '"state"' not in line:
                continue
            try:
                body = json.loads(line).get("state")
            except json.JSONDecodeError:
                continue  # a line cut by the crash
            if isinstance(body, dict):
                state = body.get("state", "JOB_STATE_UNSPECIFIED")
    return state


def unfinished_runs(run_root: Path, depth: int = 2) -> Iterator[Path]:
    """Run folders under `run_root` whose job was running or pending when its scheduler stopped."""
    if not run_root.is_dir():
        return
    for events in sorted(run_root.glob("events.jsonl" if depth == 0 else "*/" * depth + "events.jsonl")):
        folder = events.parent
        if not (folder / "config.yaml").is_file() or not (folder / "workflow.yaml").is_file():
            continue
        if _last_state(events) not in TERMINAL_NAMES:
            yield folder
    if depth > 1:
        yield from unfinished_runs(run_root, depth - 1)
