"""Which failures restart a job's services (a dead peer, not bad input or a user's error), and which run
folders a restarted scheduler resumes (running or pending when it stopped, not finished ones)."""

from __future__ import annotations

import json

from meshrl.common.errors import MODEL_NOT_LOADED, DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable
from meshrl.scheduler.recovery import restartable, unfinished_runs
from meshrl.scheduler.step.dag.executor import NodeFailed


def test_a_dead_peer_restarts_bad_input_and_user_errors_do_not():
    assert restartable(Unavailable("trainer gone"))
    assert restartable(NodeFailed("actor_train", 2, "...", DeadlineExceeded("no answer")))
    assert not restartable(NodeFailed("reward", 2, "...", RuntimeError("user reward raised")))
    assert not restartable(NodeFailed("rollout", 2, "...", InvalidArgument("bad n")))
    assert not restartable(ValueError("bug"))
    # a trainer restarted (by a supervisor) while its call was retried answers without its models
    # (told by the typed reason beside the status, not by the message)
    lost = FailedPrecondition("no model loaded for role 'actor' (loaded: none)", reason=MODEL_NOT_LOADED)
    assert restartable(NodeFailed("actor_train", 3, "...", lost))
    assert not restartable(FailedPrecondition("no model loaded for role 'actor' (said by something else)"))
    assert not restartable(FailedPrecondition("weights are released; resume them first"))
    try:
        try:
            raise Unavailable("redis down")
        except Unavailable as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert restartable(outer)


def _run(root, name: str, states: list[str], files=True, torn=False):
    folder = root / name
    folder.mkdir(parents=True)
    if files:
        (folder / "config.yaml").write_text("{}")
        (folder / "workflow.yaml").write_text("{}")
    lines = [json.dumps({"log": "x"})] + [json.dumps({"state": {"state": s}}) for s in states]
    (folder / "events.jsonl").write_text("\n".join(lines) + ('\n{"state": {"sta' if torn else "\n"))
    return folder


def test_unfinished_runs_are_the_running_and_pending_ones(tmp_path):
    running = _run(tmp_path, "a", ["JOB_STATE_RUNNING"], torn=True)  # the crash cut the last line
    pending = _run(tmp_path, "team/b", [])
    _run(tmp_path, "c", ["JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"])
    _run(tmp_path, "d", ["JOB_STATE_RUNNING", "JOB_STATE_FAILED"])
    _run(tmp_path, "e", ["JOB_STATE_RUNNING"], files=False)  # not a resumable run folder
    assert sorted(unfinished_runs(tmp_path)) == sorted([running, pending])
    assert list(unfinished_runs(tmp_path / "missing")) == []
