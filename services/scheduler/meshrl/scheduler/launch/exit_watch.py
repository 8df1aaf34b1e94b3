"""Notices at once when a service the scheduler launched as a child process exits on its own (killed, crashed).

Without it a dead trainer or data buffer is noticed only when a call to it reaches its deadline
(`trainer.request_timeout_seconds`, minutes by default): its channels wait for the peer to come back, as they
should for a service that a supervisor restarts. A launched service has no supervisor but the job itself, so
`JobServices` gives its `ProcessLauncher` to an `ExitWatch`, which polls the processes and reports each one
that ended without being stopped; `JobServices` then fails the calls that wait on it, and the job's recovery
(`job.max_restarts`) restarts the services at once. A service stopped on purpose (`ProcessLauncher.stop`, a
replica scaled away) is taken off the launcher's list before it is signalled and is never reported.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from meshrl.scheduler.launch.launcher import ProcessLauncher

log = logging.getLogger(__name__)


def describe_exit(code: int) -> str:
    """'code 3' or 'signal SIGKILL' (Popen's negative return code)."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


class ExitWatch:
    """Polls `launcher.procs` every `interval` seconds; calls `on_exit(name, returncode)` once per service that
    exited while still listed (from the watch's own thread)."""

    def __init__(self, launcher: ProcessLauncher, on_exit: Callable[[str, int], None], interval: float = 0.2) -> None:
        self.launcher = launcher
        self.on_exit = on_exit
        self.interval = interval
        self._reported: set[int] = set()  # pids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meshrl-exit-watch", daemon=True)

    def start(self) -> ExitWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops watching (before the services are stopped on purpose); waits for a report in progress."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def check(self) -> None:
        """One pass over the launched processes (the watch's loop; callable directly)."""
        for name, service in list(self.launcher.procs.items()):
            proc = service.proc
            if proc is None or proc.pid in self._reported or proc.poll() is None:
                continue
            if self.launcher.procs.get(name) is not service or self._stop.is_set():
                continue  # stopped on purpose meanwhile, or the job is closing its services
            self._reported.add(proc.pid)
            try:
                self.on_exit(name, proc.returncode)
            except Exception:  # noqa: BLE001 - the watch must go on for the other services
                log.exception("reporting the exit of %s failed", name)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()
