"""The one serve-and-stop routine of the four services' `__main__`: logging and telemetry, build, bind,
announce, wait for SIGTERM / SIGINT (or the launching parent's exit), drain, stop, release.

A service hands `run_service` a builder that returns `Hosted`: its servicers plus three optional hooks, so that
each `__main__` says only what is particular to it (the data buffer closes its Redis, the trainer stops its
ranks, a rollout replica registers, drains and deregisters).

Start and stop are kept short: the stop signals are armed before anything is built (a SIGTERM during start-up
ends the start and exits 0 after the same clean-up as a normal stop), the garbage collector is paused while the
service imports and builds, and what start-up created is then frozen out of the collector (`gc.freeze`), so
neither later collections nor the interpreter's exit walk the hundreds of thousands of objects that torch and
megatron-core leave behind (measured on the trainer: that walk was ~2 s of a 2.6 s stop).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from meshrl.common import telemetry
from meshrl.common.exposure import exposure_warnings
from meshrl.common.grpc_server import EXIT_WITH_PARENT_ENV, RunningServer, Service, start_server
from meshrl.common.weight_group_secret import set_group_secret

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class Hosted:
    """What a service serves, and what it does around the server's life."""

    services: Sequence[Service]
    started: Callable[[RunningServer], None] | None = None  # the port is bound: register, report, load
    draining: Callable[[RunningServer], None] | None = None  # stop was asked, the server still answers
    stopped: Callable[[], None] | None = None  # the server is down: release resources (also after a failed start)
    tokens: Sequence[str] = ()  # bearer tokens admitted beside server.auth's (the scheduler's submitters)


class StopDuringStartup(BaseException):
    """SIGTERM / SIGINT arrived while the service was starting. A BaseException (like KeyboardInterrupt), so
    that no `except Exception` in a builder swallows it; `run_service` catches it and exits cleanly."""


class StopSignals:
    """SIGTERM / SIGINT handlers, armed before the service builds: during start-up a signal raises
    `StopDuringStartup` in the main thread (the start ends at once); once serving, it only sets the event that
    `wait` blocks on. Arm from the main thread (Python delivers signals only there)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason: str | None = None
        self.starting = True
        self._previous: dict[int, Any] = {}

    def arm(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def disarm(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def serving(self) -> None:
        """From now on a signal asks for a stop instead of aborting the start."""
        self.starting = False

    def _handle(self, signum: int, _frame: Any) -> None:
        self.reason = self.reason or signal.Signals(signum).name
        self.event.set()
        if self.starting:
            raise StopDuringStartup(self.reason)

    def wait(self) -> str:
        """Blocks until a stop signal, or until the launching parent is gone when MESHRL_EXIT_WITH_PARENT=1 (a
        service launched by a scheduler exits with it, even after a kill -9). Returns what stopped it."""
        parent = os.getppid() if os.environ.get(EXIT_WITH_PARENT_ENV) == "1" else None
        while not self.event.wait(0.5):
            if parent is not None and os.getppid() != parent:
                return f"parent process {parent} is gone"
        return self.reason or "stop requested"


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pauses automatic garbage collection for the block (start-up creates objects that live as long as the
    process: collecting while importing torch only walks them again and again), then restores its state."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_service(name: str, cfg: Any, build: Callable[[], Hosted], *, instance: str | None = None) -> None:
    """Serves `build()`'s services with `cfg.server` until stopped; `cfg.telemetry` names the exporters."""
    signals = StopSignals().arm()
    logging.basicConfig(level=logging.INFO, format=telemetry.LOG_FORMAT, stream=sys.stderr)
    hosted: Hosted | None = None
    running: RunningServer | None = None
    try:
        with collector_paused():
            telemetry.install_log_correlation()
            telemetry.setup_telemetry(name, cfg.telemetry, instance=instance)
            set_group_secret(cfg.server.auth.token())  # what weight-group members prove to each other
            hosted = build()
            running = start_server(cfg.server, hosted.services, tokens=hosted.tokens)
            for warning in exposure_warnings(cfg, running.address, more_tokens=bool(hosted.tokens)):
                log.warning("%s: %s", name, warning)
            if hosted.started is not None:
                hosted.started(running)
        gc.freeze()  # what start-up built lives until exit: keep it out of every later collection
        signals.serving()
        print(f"meshrl {name} serving on {running.address}", flush=True)
        why = signals.wait()
        log.info("%s: stopping within %.0fs", why, cfg.server.grace_seconds)
        if hosted.draining is not None:
            hosted.draining(running)
    except StopDuringStartup as stop:
        log.info("%s during start-up: stopping", stop)
    finally:
        signals.serving()  # a second signal during clean-up must not abort it
        if running is not None:
            running.stop(cfg.server.grace_seconds)
        if hosted is not None and hosted.stopped is not None:
            hosted.stopped()
        telemetry.shutdown_telemetry()
        set_group_secret(None)
        signals.disarm()
