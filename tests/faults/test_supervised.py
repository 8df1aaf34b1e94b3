"""Faults in a deployment the scheduler did not start: `meshrl up` (its supervisor restarts what dies) and a
job that only connects to those services. With no person involved, the job runs to its end through:
- a replica frozen (SIGSTOP) while a weight update reaches it: it misses the version, takes no traffic, and
  is refitted once it answers again (SIGCONT);
- the trainer killed (kill -9) mid-step: the supervisor restarts it on its address and the job resumes
  from its last checkpoint;
- a replica killed (kill -9) mid-generation: its rows finish on the other replica and the supervisor
  restarts it on its address (a replica that comes back with older weights is found behind by the router
  and refitted before it serves: tests/unit/rollout/test_router.py).
Adds its rows to the fault table of test_faults.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from test_faults import JOB_SECONDS, TABLE, _kill, _print_table, _samples_lost, _tail, add_rows, job_config

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.workflow import builtin_workflow_text

pytestmark = pytest.mark.faults
STEPS = 6


def _meshrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "meshrl.scheduler.cli", *args], capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def supervised(tiny_task, tmp_path):
    state = tmp_path / "state"
    # the job's run folder (tmp_path/runs) is one of the roots the launched trainer and replicas may touch
    out = _meshrl(
        "up",
        "--model",
        tiny_task["model"],
        "--replicas",
        "2",
        "--state-dir",
        str(state),
        "--job-roots",
        str(tmp_path / "runs"),
        "--job-roots",
        str(Path(tiny_task["model"]).parent),
    )
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        yield state
    finally:
        if (state / "supervisor.json").exists() or (state / "services.json").exists():
            _meshrl("down", "--state-dir", str(state))


@dataclass
class Fault:
    name: str
    node: str  # inject when this node reaches RUNNING ...
    after: str  # ... once a log line containing this was seen ("" for at once)
    inject: Callable[[], int]
    injected: int = 0
    step: int = 0  # the step it was injected at
    steps_lost_before: int = 0


def _record(state: Path) -> dict[str, dict]:
    """The supervisor's record of the services: name -> address, pid, restarts."""
    return {s["name"]: s for s in json.loads((state / "services.json").read_text())}


def _pid(state: Path, name: str) -> int:
    return _record(state)[name]["pid"]


def _address(state: Path, name: str) -> str:
    return _record(state)[name]["address"]


def _freeze_for(pid: int, seconds: float) -> int:
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(seconds, os.kill, (pid, signal.SIGCONT)).start()
    return 1


@pytest.mark.timeout(JOB_SECONDS + 300)
def test_a_job_on_supervised_services_survives_a_frozen_and_a_killed_replica_and_a_killed_trainer(
    tiny_task, tmp_path, supervised, capsys
):
    state = supervised
    config = yaml.safe_load(job_config(tiny_task, tmp_path / "runs", steps=STEPS))
    overlay = yaml.safe_load((state / "services.yaml").read_text())
    for section, values in overlay.items():
        config.setdefault(section, {}).update(values)
    jobs = JobManager()
    record = jobs.create(builtin_workflow_text("grpo"), yaml.safe_dump(config), [], job_id="s1")
    run = record.runner.run.root
    faults = [
        # frozen while it trains, so that the publication after it meets a replica that does not answer
        Fault(
            "replica SIGSTOP during a weight update",
            "actor_train",
            "checkpoint saved at step 1",
            lambda: _freeze_for(_pid(state, "rollout-1"), 8.0),
        ),
        # once the frozen one serves again: the supervisor restarts the trainer, the job resumes
        Fault(
            "trainer kill -9 mid-step (up)",
            "actor_train",
            "refitted to weight version",
            lambda: _kill([_pid(state, "trainer")]),
        ),
        # after the resume: its rows finish on the other replica
        Fault(
            "replica kill -9 mid-generation (up)", "rollout", "resumed from", lambda: _kill([_pid(state, "rollout-0")])
        ),
    ]
    thread = threading.Thread(target=jobs.run, args=(record,), daemon=True)
    thread.start()
    position, pending, seen = 0, list(faults), ""
    deadline = time.monotonic() + JOB_SECONDS
    while thread.is_alive() and time.monotonic() < deadline:
        events, _ = record.events.read(position, timeout=0.2)
        position += len(events)
        for e in events:
            if e.WhichOneof("body") == "log":
                seen += e.log + "\n"
            elif pending and e.WhichOneof("body") == "node" and e.node.state == spb.NODE_STATE_RUNNING:
                f = pending[0]
                if e.node.node_id == f.node and f.after in seen:
                    f.step, f.steps_lost_before = e.node.step, record.steps_lost
                    f.injected = f.inject()
                    seen = ""
                    pending.pop(0)
    thread.join(timeout=max(deadline - time.monotonic(), 1))
    assert not thread.is_alive(), f"the job did not end within {JOB_SECONDS} s:\n" + _tail(record)
    survived = record.state == spb.JOB_STATE_SUCCEEDED
    lost = _samples_lost(run)
    add_rows(faults, record, lost, survived, STEPS)
    _print_table(capsys)
    logs = _tail(record, lines=400)
    assert survived, record.error + logs
    assert all(f.injected == 1 for f in faults), [(f.name, f.injected) for f in faults] + [logs]
    assert sorted(lost) == list(range(1, STEPS + 1)) and sum(lost.values()) == 0, lost
    assert all(row[3] <= 1 for row in TABLE), "a restart lost more than checkpoint.every steps"
    assert f"replica {_address(state, 'rollout-1')} missed weight version" in logs, logs
    assert f"replica {_address(state, 'rollout-1')} refitted" in logs, logs
    deadline = time.monotonic() + 180  # a loaded host takes its time to start the killed replica again
    while time.monotonic() < deadline and _record(state)["rollout-0"]["restarts"] < 1:
        time.sleep(0.5)
    services = _record(state)
    assert services["rollout-0"]["restarts"] == 1 and services["trainer"]["restarts"] == 1, services
