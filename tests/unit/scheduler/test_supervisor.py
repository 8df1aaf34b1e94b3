"""The restart policy of `meshrl up`'s supervisor: backoff doubling up to its cap, a service that keeps dying
is left down with the reason logged, restarts older than the window are forgotten, and a plan is checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from meshrl.scheduler.launch.process import ServiceProcess
from meshrl.scheduler.launch.supervisor import Plan, PlannedService, RestartPolicy, Supervised, Supervisor


def _dead_member(tmp_path) -> Supervised:
    proc = ServiceProcess("trainer", [], str(tmp_path / "logs" / "trainer.log"))
    proc.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    proc.proc.wait()
    return Supervised(PlannedService(service="trainer", name="trainer", args=[]), proc, address="127.0.0.1:1")


@pytest.fixture
def supervisor(tmp_path) -> Supervisor:
    (tmp_path / "logs").mkdir()
    policy = RestartPolicy(max_restarts=2, window_seconds=100, backoff_seconds=1, max_backoff_seconds=1.5)
    return Supervisor(tmp_path, Plan(stages=[], policy=policy))


def test_backoff_doubles_to_its_cap_and_a_service_that_keeps_dying_is_left_down(supervisor, tmp_path):
    m = _dead_member(tmp_path)
    supervisor.members = [m]
    supervisor._due(m, now=10.0)
    assert m.next_try == 11.0 and not m.given_up
    m.recent.append(10.0)
    supervisor._due(m, now=12.0)
    assert m.next_try == 13.5  # 2 s, capped at 1.5
    m.recent.append(12.0)
    supervisor._due(m, now=14.0)
    assert m.given_up
    log = (tmp_path / "logs" / "supervisor.log").read_text()
    assert "trainer exited (code 3); restarting in 1.0s" in log
    assert "2 restarts within 100s: left down (see logs/trainer.log)" in log
    (entry,) = json.loads((tmp_path / "services.json").read_text())
    assert entry["name"] == "trainer" and entry["up"] is False


def test_restarts_older_than_the_window_are_forgotten(supervisor, tmp_path):
    m = _dead_member(tmp_path)
    m.recent.extend([0.0, 1.0])
    supervisor._due(m, now=500.0)
    assert not m.given_up and m.next_try == 501.0 and not m.recent


def test_a_plan_with_an_unknown_field_or_a_bad_policy_is_refused():
    with pytest.raises(ValidationError, match="replicas"):
        Plan.model_validate({"stages": [], "replicas": 2})
    with pytest.raises(ValidationError, match="max_restarts"):
        RestartPolicy(max_restarts=-1)


def test_a_stop_ends_a_start_in_progress_instead_of_waiting_for_it(supervisor, tmp_path):
    proc = ServiceProcess("trainer", [], str(tmp_path / "logs" / "trainer.log"))
    proc.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    supervisor.starting = [proc]
    supervisor.on_signal()
    assert supervisor.stopping.is_set()
    assert proc.proc.wait(timeout=10) != 0  # ended by SIGTERM, not left to outlive the supervisor
