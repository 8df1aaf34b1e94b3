"""Spawned member processes of one weight-plane test: start, collect reported events, clean up."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time

import _weights_workers as workers

CTX = mp.get_context("spawn")


class Members:
    def __init__(self) -> None:
        self.results = CTX.Queue()
        self.procs: dict[str, mp.Process] = {}
        self._seen: dict[tuple[str, str], object] = {}

    def queue(self):
        return CTX.Queue()

    def start(self, role: str, target, *args) -> None:
        proc = CTX.Process(target=workers.run, args=(role, target, self.results, *args), daemon=True)
        proc.start()
        self.procs[role] = proc

    def get(self, role: str, event: str, timeout: float = 120.0):
        """Waits for `role` to report `event`; fails at once on any member's error."""
        deadline = time.monotonic() + timeout
        while (role, event) not in self._seen:
            try:
                who, what, payload = self.results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"{role} did not report {event!r} within {timeout}s; got {list(self._seen)}"
                ) from None
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
