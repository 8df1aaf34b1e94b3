"""ExitWatch: a launched service that dies on its own is reported once, with how it ended; one stopped on
purpose (taken off the launcher's list first) and anything after the watch stops are not reported."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from meshrl.scheduler.launch.exit_watch import ExitWatch, describe_exit
from meshrl.scheduler.launch.launcher import ProcessLauncher
from meshrl.scheduler.launch.process import ServiceProcess


@pytest.fixture
def launcher(tmp_path):
    launcher = ProcessLauncher(tmp_path, start_timeout=10)
    for name in ("trainer", "rollout-0"):
        service = ServiceProcess("trainer", [], str(tmp_path / f"{name}.log"))
        service.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        launcher.procs[name] = service
    yield launcher
    for service in launcher.procs.values():
        service.proc.kill()
        service.proc.wait(5)


def _wait_exit(service: ServiceProcess) -> None:
    service.proc.wait(10)


def test_a_killed_service_is_reported_once_with_its_signal(launcher):
    seen: list[tuple[str, int]] = []
    watch = ExitWatch(launcher, lambda name, code: seen.append((name, code)))
    watch.check()
    assert seen == []  # both alive
    launcher.procs["trainer"].proc.send_signal(signal.SIGKILL)
    _wait_exit(launcher.procs["trainer"])
    watch.check()
    watch.check()
    assert seen == [("trainer", -signal.SIGKILL)]
    assert describe_exit(seen[0][1]) == "signal SIGKILL" and describe_exit(3) == "code 3"


def test_a_service_stopped_on_purpose_is_not_reported(launcher):
    seen: list[str] = []
    watch = ExitWatch(launcher, lambda name, code: seen.append(name))
    launcher.stop("rollout-0", grace=5)  # scaled away: off the list before it is signalled
    watch.check()
    assert seen == []


def test_the_watch_thread_reports_until_stopped(launcher):
    seen: list[str] = []
    watch = ExitWatch(launcher, lambda name, code: seen.append(name), interval=0.05).start()
    launcher.procs["rollout-0"].proc.kill()
    deadline = time.monotonic() + 20
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen == ["rollout-0"]
    watch.stop()
    launcher.procs["trainer"].proc.kill()
    _wait_exit(launcher.procs["trainer"])
    time.sleep(0.3)
    assert seen == ["rollout-0"]  # stopped: the job is closing its services on purpose
