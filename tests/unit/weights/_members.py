"""Spawned member processes of one weight-plane test: start, collect reported events, clean up.

Each member reports on a queue of its own. A multiprocessing queue's writers share one lock, which a
writer's feeder thread holds until its message is on the pipe, so a member that a test stops with
SIGSTOP right after reading its message could otherwise keep every other member from reporting.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time

import _weights_workers as workers

CTX = mp.get_context("spawn")
RESULTS = object()  # stands, in start()'s arguments, for the member's own results queue


class Members:
    results = RESULTS

    def __init__(self) -> None:
        self.inboxes: dict[str, mp.Queue] = {}
        self.procs: dict[str, mp.Process] = {}
        self._seen: dict[tuple[str, str], object] = {}

    def queue(self):
        return CTX.Queue()

    def start(self, role: str, target, *args) -> None:
        inbox = self.inboxes[role] = CTX.Queue()
        args = tuple(inbox if a is RESULTS else a for a in args)
        proc = CTX.Process(target=workers.run, args=(role, target, inbox, *args), daemon=True)
        proc.start()
        self.procs[role] = proc

    def _next(self) -> tuple | None:
        for inbox in self.inboxes.values():
            try:
                return inbox.get_nowait()
            except queue.Empty:
                continue
        return None

    def get(self, role: str, event: str, timeout: float = 120.0):
        """Waits for `role` to report `event`; fails at once on any member's error."""
        deadline = time.monotonic() + timeout
        while (role, event) not in self._seen:
            item = self._next()
            if item is None:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{role} did not report {event!r} within {timeout}s; got {list(self._seen)}")
                time.sleep(0.01)
                continue
            who, what, payload = item
            if what == "error":
                raise AssertionError(f"member {who} failed:\n{payload}")
            self._seen[(who, what)] = payload
        return self._seen[(role, event)]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot be joined
                proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
