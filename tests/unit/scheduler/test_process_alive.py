"""A launched service's `alive()` tells a killed process from a running one even while another thread waits on it
(a trainer group's watch blocks in wait()): Popen.poll() answers "running" whenever wait() holds its lock, which
let a killed trainer rank read as alive and its gloo error stay unexplained."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from meshrl.scheduler.launch.process import ServiceProcess


def test_a_killed_process_reads_as_ended_while_another_thread_holds_its_wait(tmp_path):
    service = ServiceProcess("trainer", [], str(tmp_path / "trainer.log"))
    service.proc = subprocess.Popen(["sleep", "60"])
    assert service.alive()
    with service.proc._waitpid_lock:  # what a thread blocked in proc.wait() holds
        os.kill(service.proc.pid, signal.SIGKILL)
        stat = Path(f"/proc/{service.proc.pid}/stat")
        deadline = time.monotonic() + 10
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)  # until the kernel has ended it (a zombie, not yet reaped)
        assert not service.alive()
    assert service.proc.wait(timeout=10) == -signal.SIGKILL  # still reaped as usual
    assert not service.alive()
