"""Starts `python -m meshrl.<service>` processes for the trainer tests and benchmark; stops them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


class ServiceProc:
    def __init__(self, service: str, args: list[str], workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port_file = workdir / f"{service}.port"
        self.log = workdir / f"{service}.log"
        cmd = [sys.executable, "-m", f"meshrl.{service}", *args, "--set", f"server.port_file={self.port_file}"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_address(self, timeout: float = 180.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.port_file.exists():
                return f"127.0.0.1:{self.port_file.read_text().strip()}"
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"no port file after {timeout}s:\n{self.log.read_text()[-3000:]}")

    def stop(self, grace: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode
