"""The plain-process launcher starts a batch of services together, not one after the other, raises the first
failure of a batch once every start has ended, and keeps whatever it started for `stop_all`, which stops the
batches in reverse order (the data buffer last) and the services of one batch together."""

from __future__ import annotations

import threading

import pytest

from meshrl.common.errors import Unavailable
from meshrl.scheduler.launch import launcher as launcher_module
from meshrl.scheduler.launch.launcher import ProcessLauncher, ServiceSpec


class _FakeProcess:
    """Stands in for ServiceProcess: its start (and stop) meets the others of its batch at a barrier, so a batch
    can only start (stop) if its starts overlap (one after the other, the first would wait alone and fail)."""

    barrier: threading.Barrier
    stop_barrier: threading.Barrier | None = None
    fail: set[str] = set()
    stopped: list[str] = []

    def __init__(self, service: str, args: list[str], log_path: str, env: dict[str, str]) -> None:
        self.name = log_path.rsplit("/", 1)[-1].removesuffix(".log")
        self.env = env

    def start(self, timeout: float) -> str:
        if self.name != "databuffer":
            self.barrier.wait(timeout=10)  # broken (BrokenBarrierError) if the starts do not overlap
        if self.name in self.fail:
            raise Unavailable(f"{self.name} exited with code 1 while starting")
        return f"127.0.0.1:{1000 + len(self.name)}"

    def stop(self, grace: float = 10.0) -> int:
        if self.stop_barrier is not None and self.name != "databuffer":
            self.stop_barrier.wait(timeout=10)
        self.stopped.append(self.name)
        return 0


@pytest.fixture
def fake_process(monkeypatch):
    _FakeProcess.fail, _FakeProcess.stopped, _FakeProcess.stop_barrier = set(), [], None
    monkeypatch.setattr(launcher_module, "ServiceProcess", _FakeProcess)
    return _FakeProcess


def _specs() -> list[ServiceSpec]:
    return [ServiceSpec("trainer", "trainer"), ServiceSpec("rollout", "rollout-0"), ServiceSpec("rollout", "rollout-1")]


def test_a_batch_of_services_starts_together(fake_process, tmp_path):
    fake_process.barrier = threading.Barrier(3)
    launcher = ProcessLauncher(tmp_path, start_timeout=60)
    addresses = launcher.start(_specs())
    assert addresses == {"trainer": "127.0.0.1:1007", "rollout-0": "127.0.0.1:1009", "rollout-1": "127.0.0.1:1009"}
    assert list(addresses) == ["trainer", "rollout-0", "rollout-1"]  # spec order, whatever order they finished in
    assert launcher.procs["trainer"].env["OMP_WAIT_POLICY"] == "PASSIVE"  # each still gets the child environment


def test_the_first_failure_of_a_batch_is_raised_and_what_started_is_stopped_later(fake_process, tmp_path):
    fake_process.barrier = threading.Barrier(3)
    fake_process.fail = {"rollout-0", "rollout-1"}
    launcher = ProcessLauncher(tmp_path, start_timeout=60)
    with pytest.raises(Unavailable, match="rollout-0 exited"):
        launcher.start(_specs())
    launcher.stop_all()
    assert sorted(fake_process.stopped) == ["rollout-0", "rollout-1", "trainer"] and not launcher.procs


def test_stop_all_stops_the_later_batch_together_then_the_data_buffer(fake_process, tmp_path):
    fake_process.barrier, fake_process.stop_barrier = threading.Barrier(3), threading.Barrier(3)
    launcher = ProcessLauncher(tmp_path, start_timeout=60)
    launcher.start([ServiceSpec("databuffer", "databuffer")])
    launcher.start(_specs())
    launcher.stop_all()
    assert sorted(fake_process.stopped[:3]) == ["rollout-0", "rollout-1", "trainer"]
    assert fake_process.stopped[3:] == ["databuffer"] and not launcher.procs


def test_an_empty_batch_starts_nothing(fake_process, tmp_path):
    assert ProcessLauncher(tmp_path, start_timeout=60).start([]) == {}
