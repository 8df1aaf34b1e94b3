"""A run's job-level checkpoint marker: job_state.json and COMPLETE are written durably (temp + fsync +
rename, COMPLETE last, holding job_state.json's digest), and resume falls back to the newest step whose marker
and job state agree when a later one is torn (a crash on a disk without ordered writes, an older meshrl)."""

from __future__ import annotations

import json
import os

import pytest

from meshrl.common.durable_file import write_durably
from meshrl.scheduler.rundir import RunDir


def _mark(run: RunDir, step: int) -> None:
    path = run.checkpoint_path(step)
    path.mkdir(parents=True)
    run.mark_checkpoint(path, {"step": step, "weight_version": step, "data": "", "warmup_done": True})


@pytest.mark.parametrize(
    "job_state, complete",
    [
        (b'{"step": 4, "weight_ver', b""),  # an older meshrl's empty marker over a torn job state
        (b"", b""),
        (None, b""),  # the marker reached the disk, the job state did not
        (b'{"step": 4}', b'{"job_state.json": "0f'),  # a torn marker
        (b'{"step": 4}', json.dumps({"job_state.json": "0" * 64}).encode()),  # the job state of another write
    ],
)
def test_resume_skips_a_torn_checkpoint_for_the_one_before(tmp_path, job_state, complete):
    run = RunDir(tmp_path / "run")
    _mark(run, 2)
    torn = run.checkpoint_path(4)
    torn.mkdir()
    if job_state is not None:
        (torn / "job_state.json").write_bytes(job_state)
    (torn / "COMPLETE").write_bytes(complete)
    assert run.latest_checkpoint() == run.checkpoint_path(2)
    assert run.checkpoint_problem(torn)


def test_marked_checkpoints_resume_from_the_newest_and_older_empty_markers_still_count(tmp_path):
    run = RunDir(tmp_path / "run")
    _mark(run, 2)
    _mark(run, 6)
    assert run.latest_checkpoint() == run.checkpoint_path(6)
    assert json.loads((run.checkpoint_path(6) / "job_state.json").read_text())["step"] == 6
    legacy = run.checkpoint_path(8)
    legacy.mkdir()
    (legacy / "job_state.json").write_text(json.dumps({"step": 8}))
    (legacy / "COMPLETE").write_text("")
    assert run.latest_checkpoint() == legacy
    assert sorted(p.name for p in run.checkpoint_path(6).iterdir()) == ["COMPLETE", "job_state.json"]  # no temps


def test_a_durable_write_that_fails_leaves_the_old_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "job_state.json"
    write_durably(target, b'{"step": 1}')
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))

    def crash(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_durably(target, b'{"step": 2, "long": "' + b"x" * 4096 + b'"}')
    assert target.read_bytes() == b'{"step": 1}' and [p.name for p in tmp_path.iterdir()] == ["job_state.json"]
    assert synced, "the new content was not fsynced before the rename"
