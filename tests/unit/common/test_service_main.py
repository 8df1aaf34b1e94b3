"""`meshrl.common.service_main.run_service` in a real process: SIGTERM during start-up (while the builder runs)
ends the start at once and exits 0, with the handlers armed before the build; SIGTERM after it serves runs the
stop hook and exits 0; the garbage collector is paused inside `collector_paused` and restored after."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import time
from pathlib import Path

from meshrl.common.service_main import collector_paused

SERVICE = """
import sys, time
from pathlib import Path
from types import SimpleNamespace
from meshrl.common.grpc_server import ServerConfig
from meshrl.common.service_main import Hosted, run_service
from meshrl.common.telemetry import TelemetryConfig

marks = Path(sys.argv[1])
def mark(what):
    with marks.open("a") as f:
        f.write(what + "\\n")

def build():
    mark("building")
    if sys.argv[2] == "slow":
        time.sleep(120)
    return Hosted([], stopped=lambda: mark("stopped"))

cfg = SimpleNamespace(server=ServerConfig(host="127.0.0.1", port=0, grace_seconds=1), telemetry=TelemetryConfig())
run_service("probe", cfg, build)
mark("returned")
"""


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    marks = tmp_path / "marks"
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(marks), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, marks


def _wait_for(marks: Path, what: str, proc: subprocess.Popen) -> None:
    while not (marks.exists() and what in marks.read_text().split()):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)


def test_sigterm_during_startup_exits_zero_without_serving(tmp_path):
    proc, marks = _start(tmp_path, "slow")
    _wait_for(marks, "building", proc)  # the builder runs: the handlers are already armed
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "SIGTERM during start-up: stopping" in err
    assert "serving on" not in out
    assert marks.read_text().split() == ["building", "returned"]  # nothing was built, so no stop hook ran


def test_sigterm_after_serving_runs_the_stop_hook_and_exits_zero(tmp_path):
    proc, marks = _start(tmp_path, "fast")
    assert "meshrl probe serving on 127.0.0.1:" in proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "SIGTERM: stopping" in err
    assert marks.read_text().split() == ["building", "stopped", "returned"]


def test_collector_paused_inside_and_restored_after():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()
