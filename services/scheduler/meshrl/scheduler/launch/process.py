"""One service process (`python -m meshrl.<svc> ...`): start it, learn its port, stop it.

Used directly for plain-process deployments (`meshrl up`) and inside the Ray actor that
places a service on its placement-group bundle (`launcher.py`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from meshrl.common.errors import DeadlineExceeded, Unavailable
from meshrl.common.grpc_server import EXIT_WITH_PARENT_ENV
from meshrl.scheduler.launch.cpu_placement import CPU_CORES_ENV, parse_cores


class ServiceProcess:
    """A child process running one meshrl service, with its log file and port file."""

    def __init__(
        self, service: str, args: list[str], log_path: str, env: dict[str, str] | None = None, exit_with_parent=True
    ) -> None:
        self.service = service
        self.exit_with_parent = exit_with_parent
        self.args = args
        self.log_path = Path(log_path)
        self.env = env or {}
        self.port_file = self.log_path.with_suffix(".port")
        self.address_file = self.log_path.with_suffix(".address")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float) -> str:
        """Starts the process and returns the address it advertises once it serves."""
        self.spawn()
        return self.wait_serving(timeout)

    def spawn(self) -> None:
        """Starts the process without waiting (a trainer rank > 0 serves nothing: it joins rank 0's world)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.port_file.unlink(missing_ok=True)
        self.address_file.unlink(missing_ok=True)
        # A free port unless the caller chose one; the service reports it through the port file.
        port = [] if "--port" in self.args or any(a.startswith("server.port=") for a in self.args) else ["--port", "0"]
        cmd = [
            sys.executable,
            "-m",
            f"meshrl.{self.service}",
            *port,
            *self.args,
            "--set",
            f"server.port_file={self.port_file}",
            "--set",
            f"server.address_file={self.address_file}",
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        env[EXIT_WITH_PARENT_ENV] = "1" if self.exit_with_parent else "0"
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        if self.env.get(CPU_CORES_ENV):  # before the interpreter starts its first thread: every thread stays there
            os.sched_setaffinity(self.proc.pid, parse_cores(self.env[CPU_CORES_ENV]))

    def wait_serving(self, timeout: float) -> str:
        """The address the started process advertises once it serves; raises when it exits or times out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.port_file.exists():  # written after the address file
                if self.address_file.exists():
                    return self.address_file.read_text().strip()
                return f"{self._host()}:{self.port_file.read_text().strip()}"
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise Unavailable(f"{self.service} exited with code {self.proc.returncode} while starting:\n{tail}")
            time.sleep(0.1)
        self.stop(grace=2)
        raise DeadlineExceeded(f"{self.service} did not start within {timeout:.0f}s; see {self.log_path}")

    def _host(self) -> str:
        for i, arg in enumerate(self.args):
            if arg == "--host" and i + 1 < len(self.args):
                return self.args[i + 1]
        return "127.0.0.1"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        """Whether the process still runs. Exact while another thread waits on it (a trainer group's watch):
        Popen.poll() answers "running" whenever wait() holds its lock, even for a process already killed;
        waitid with WNOWAIT reads the exit without reaping it."""
        if self.proc is None or self.proc.returncode is not None:
            return False
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:  # reaped meanwhile by the waiting thread
            return False

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM (graceful), then SIGKILL after `grace` seconds. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        # What it left behind (it was killed: an embedded redis-server that would hold its append-only file and
        # write it alongside the next one) leads no group of its own: it goes with the service's group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode
