"""Fault injection: one job runs through a kill -9 of its trainer mid-step, a kill -9 of Redis mid-put, a
kill -9 of its replica mid-generation and a kill -9 of its data buffer mid-step, with no person involved; a
second job survives a kill -9 of its scheduler (a new one resumes it from the run folder).

Prints the table fault / injected / survived / steps lost / samples lost. Steps lost are steps redone after
a restart (bounded by checkpoint.every); samples lost are samples missing from a completed step's record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from _inject import child_pids, service_pids

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.workflow import builtin_workflow_text

pytestmark = pytest.mark.faults
STEPS, PROMPTS, N = 5, 4, 2
JOB_SECONDS = 540  # service start-up dominates: ~20 s on an idle 2-core host, minutes on a loaded one
FOUR_RESTARTS_SECONDS = 780  # the first test restarts its services four times
TABLE: list[tuple] = []


def job_config(task: dict, run_root: Path, **job) -> str:
    return yaml.safe_dump(
        {
            "job": {
                "name": "faults",
                "steps": STEPS,
                "run_root": str(run_root),
                "max_restarts": 4,
                "restart_backoff_seconds": 0.5,
                **job,
            },
            "model": {"path": task["model"]},
            "data": {"train": task["train"], "eval": task["eval"], "prompts_per_step": PROMPTS},
            # a call to a dead service is retried (UNAVAILABLE) until its deadline: these bound the time to notice
            "rollout": {"replicas": 1, "n": N, "max_tokens": 6, "request_timeout_seconds": 30},
            "eval": {"every": 0, "max_prompts": 4},
            "checkpoint": {"every": 1},
            "weights": {"timeout_seconds": 5},
            "services": {"use_ray": False, "start_timeout_seconds": 120},
            "trainer": {"optimizer": {"lr": 1e-3}, "request_timeout_seconds": 30},
        }
    )


@dataclass
class Fault:
    name: str
    node: str  # inject when this node of `step` reaches `state`
    step: int
    state: int
    inject: callable
    injected: int = 0
    restarts_before: int = 0
    steps_lost_before: int = 0


def _kill(pids: list[int], sig: int = signal.SIGKILL) -> int:
    for pid in pids:
        os.kill(pid, sig)
    return len(pids)


def _samples_lost(run_dir: Path) -> dict[int, int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: max(PROMPTS * N - int(r.get("rollout/samples", 0)), 0) for r in rows}


def _tail(record, lines: int = 30) -> str:
    """The job's last log lines and failed nodes, for a failure message."""
    out = []
    for e in record.events.read(0, 0)[0]:
        if e.WhichOneof("body") == "log":
            out.append(e.log[:300])
        elif e.WhichOneof("body") == "node" and e.node.state == spb.NODE_STATE_FAILED:
            out.append(f"step {e.node.step} {e.node.node_id} failed: {e.node.error[-300:]}")
    return "\n".join(out[-lines:])


def add_rows(faults: list, record, lost: dict[int, int], survived: bool, steps: int) -> None:
    """One TABLE row per fault (in injection order): steps redone and samples lost until the next fault."""
    for i, f in enumerate(faults):
        nxt = faults[i + 1] if i + 1 < len(faults) and faults[i + 1].injected else None
        steps_lost = (nxt.steps_lost_before if nxt else record.steps_lost) - f.steps_lost_before
        upto = nxt.step if nxt else steps + 1
        TABLE.append(
            (
                f.name,
                f.injected,
                survived and f.injected > 0,
                steps_lost,
                sum(v for s, v in lost.items() if f.step <= s < upto),
            )
        )


def _print_table(capsys) -> None:
    with capsys.disabled():
        print("\n\nfault                                 injected  survived  steps lost  samples lost")
        for row in TABLE:
            print(f"{row[0]:<38}{row[1]:>8}  {row[2]!s:>8}  {row[3]:>10}  {row[4]:>12}")
        print()


@pytest.mark.timeout(FOUR_RESTARTS_SECONDS + 60)
def test_one_job_survives_a_kill_of_each_of_its_services(tiny_task, tmp_path, capsys):
    jobs = JobManager()
    record = jobs.create(builtin_workflow_text("grpo"), job_config(tiny_task, tmp_path), [], job_id="f1")
    run = record.runner.run.root
    running = spb.NODE_STATE_RUNNING
    faults = [
        Fault("trainer kill -9 mid-step", "actor_train", 2, running, lambda: _kill(service_pids(run, "trainer"))),
        Fault(
            "redis kill -9 mid-put",
            "rollout",
            3,
            running,
            lambda: _kill([c for p in service_pids(run, "databuffer") for c in child_pids(p, "redis-server")]),
        ),
        Fault(
            "replica kill -9 mid-generation",
            "rollout",
            4,
            running,
            lambda: _kill(service_pids(run, "rollout", "rollout-0")),
        ),
        # the service itself (its embedded redis-server is orphaned: the restart must end it first)
        Fault("data buffer kill -9 mid-step", "advantage", 5, running, lambda: _kill(service_pids(run, "databuffer"))),
    ]
    thread = threading.Thread(target=jobs.run, args=(record,), daemon=True)
    thread.start()
    position, pending = 0, list(faults)
    deadline = time.monotonic() + FOUR_RESTARTS_SECONDS
    while thread.is_alive() and time.monotonic() < deadline:
        events, _ = record.events.read(position, timeout=0.2)
        position += len(events)
        for e in events:
            if pending and e.WhichOneof("body") == "node":
                f = pending[0]
                if (e.node.node_id, e.node.step, e.node.state) == (f.node, f.step, f.state):
                    f.restarts_before, f.steps_lost_before = record.restarts, record.steps_lost
                    f.injected = f.inject()
                    pending.pop(0)
    thread.join(timeout=max(deadline - time.monotonic(), 1))
    assert not thread.is_alive(), f"the job did not end within {FOUR_RESTARTS_SECONDS} s:\n" + _tail(record)
    survived = record.state == spb.JOB_STATE_SUCCEEDED
    lost = _samples_lost(run)
    add_rows(faults, record, lost, survived, STEPS)
    _print_table(capsys)
    assert survived, record.error + _tail(record)
    assert all(f.injected == 1 for f in faults), [(f.name, f.injected) for f in faults]
    assert sorted(lost) == list(range(1, STEPS + 1)) and sum(lost.values()) == 0, lost
    assert all(row[3] <= 1 for row in TABLE), "a restart lost more than checkpoint.every steps"
    # a dead service is noticed from its exit (launch/exit_watch.py), not at a call's deadline
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    logs = [e.get("log", "") for e in events]
    for name in ("trainer", "rollout-0", "databuffer"):
        assert any(line.startswith(f"{name} exited with signal SIGKILL") for line in logs), name
    failed = [e["node"].get("error", "") for e in events if e.get("node", {}).get("state") == "NODE_STATE_FAILED"]
    assert failed and not any("DeadlineExceeded" in error for error in failed), failed


DRIVER = """
import sys
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.workflow import builtin_workflow_text
jobs = JobManager(run_root=sys.argv[1])
record = jobs.create(builtin_workflow_text("grpo"), open(sys.argv[2]).read(), [], job_id="f2")
jobs.run(record)
"""


def test_a_scheduler_killed_mid_step_is_picked_up_by_the_next_one(tiny_task, tmp_path, capsys):
    root = tmp_path / "runs"
    config = tmp_path / "job.yaml"
    data = yaml.safe_load(job_config(tiny_task, root))
    del data["job"]["run_root"]
    data["job"]["steps"] = 3
    config.write_text(yaml.safe_dump(data))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(root), str(config)], cwd=os.getcwd())
    metrics = root / "f2" / "metrics.jsonl"
    deadline = time.monotonic() + JOB_SECONDS / 2
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the first scheduler ended before the fault"
    proc.kill()
    proc.wait(10)
    logged = len(metrics.read_text().splitlines())
    time.sleep(2.0)  # its services notice their parent is gone and stop
    (record,) = JobManager(run_root=str(root)).recover()
    record.thread.join(timeout=JOB_SECONDS / 2)
    survived = record.state == spb.JOB_STATE_SUCCEEDED
    checkpoint = max(int(p.parent.name[5:]) for p in (root / "f2" / "checkpoints").glob("step_*/COMPLETE"))
    lost = _samples_lost(root / "f2")
    TABLE.append(
        ("scheduler kill -9 mid-step", 1, survived, max(logged - min(checkpoint, logged), 0), sum(lost.values()))
    )
    _print_table(capsys)
    assert survived, record.error + _tail(record)
    assert sorted(lost) == [1, 2, 3] and sum(lost.values()) == 0, lost
