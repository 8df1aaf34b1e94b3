"""The scheduler's local Ray start-up retries Ray's own startup timeout once, after stopping what the failed
attempt left running, and then fails with a clear error that the job's recovery does not retry
(meshrl.scheduler.launch.local_ray). Ray's 30 s raylet wait cannot be provoked on demand, so a stand-in for
the `ray` module raises exactly the exception Ray raises; the leftovers are real child processes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from meshrl.common.errors import ResourceExhausted
from meshrl.scheduler.launch.local_ray import init_local_ray, kill_leftovers
from meshrl.scheduler.recovery import restartable

RAY_TIMEOUT = (
    "The current node timed out during startup. This could happen because some of the raylet failed to "
    "startup or the GCS has become overloaded."
)


class FlakyRay:
    """Fails the first len(failures) inits; each failing init leaves a child process naming the temp dir."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls: list[str] = []
        self.children: list[subprocess.Popen] = []

    def init(self, **kwargs):
        self.calls.append("init")
        if self.failures:
            marker = f"--temp-dir={kwargs.get('_temp_dir')}"
            self.children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker]))
            raise self.failures.pop(0)

    def shutdown(self):
        self.calls.append("shutdown")


def _ended(child: subprocess.Popen) -> bool:
    deadline = time.monotonic() + 10
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return child.poll() is not None


def test_a_startup_timeout_is_retried_after_its_leftovers_are_stopped(tmp_path):
    ray = FlakyRay([Exception(RAY_TIMEOUT)])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--temp-dir=/elsewhere"])
    try:
        init_local_ray(ray, pause_seconds=0, _temp_dir=str(tmp_path))
        assert ray.calls == ["init", "shutdown", "init"]
        assert _ended(ray.children[0])
        assert bystander.poll() is None  # a child that names another folder is left alone
    finally:
        bystander.kill()


def test_repeated_timeouts_fail_with_what_to_do_and_are_not_restarted(tmp_path):
    ray = FlakyRay([Exception(RAY_TIMEOUT), Exception(RAY_TIMEOUT)])
    with pytest.raises(ResourceExhausted, match="services.use_ray: false") as raised:
        init_local_ray(ray, pause_seconds=0, _temp_dir=str(tmp_path))
    assert ray.calls.count("shutdown") == 2
    assert all(_ended(c) for c in ray.children)
    assert not restartable(raised.value)


def test_other_errors_are_not_retried():
    ray = FlakyRay([ValueError("bad _temp_dir")])
    with pytest.raises(ValueError, match="bad _temp_dir"):
        init_local_ray(ray, pause_seconds=0, _temp_dir="/x")
    assert ray.calls == ["init"]
    ray.children[0].kill()


def test_nothing_is_killed_without_a_temp_dir():
    assert kill_leftovers(None) == 0
    assert kill_leftovers("") == 0
