"""The one serve-and-stop routine of the four services' `__main__`: logging and telemetry, build, bind,
announce, wait for SIGTERM / SIGINT (or the launching parent's exit), drain, stop, release.

A service hands `run_service` a builder that returns `Hosted`: its servicers plus three optional hooks, so that
each `__main__` says only what is particular to it (the data buffer closes its Redis, the trainer stops its
ranks, a rollout replica registers, drains and deregisters).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from meshrl.common import telemetry
from meshrl.common.grpc_server import EXIT_WITH_PARENT_ENV, RunningServer, Service, start_server

log = logging.getLogger(__name__)


@dataclass
class Hosted:
    """What a service serves, and what it does around the server's life."""

    services: Sequence[Service]
    started: Callable[[RunningServer], None] | None = None  # the port is bound: register, report, load
    draining: Callable[[RunningServer], None] | None = None  # stop was asked, the server still answers
    stopped: Callable[[], None] | None = None  # the server is down: release resources (also after a failed start)


def wait_for_stop_signal() -> str:
    """Blocks until SIGTERM / SIGINT, or until the launching parent is gone when MESHRL_EXIT_WITH_PARENT=1
    (a service launched by a scheduler exits with it, even after a kill -9). Returns what stopped it."""
    stop = threading.Event()
    reason: list[str] = []

    def handle(signum, _frame):
        reason.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    parent = os.getppid() if os.environ.get(EXIT_WITH_PARENT_ENV) == "1" else None
    while not stop.wait(0.5):
        if parent is not None and os.getppid() != parent:
            return f"parent process {parent} is gone"
    return reason[0]


def run_service(name: str, cfg: Any, build: Callable[[], Hosted], *, instance: str | None = None) -> None:
    """Serves `build()`'s services with `cfg.server` until stopped; `cfg.telemetry` names the exporters."""
    logging.basicConfig(level=logging.INFO, format=telemetry.LOG_FORMAT, stream=sys.stderr)
    telemetry.install_log_correlation()
    telemetry.setup_telemetry(name, cfg.telemetry, instance=instance)
    hosted: Hosted | None = None
    running: RunningServer | None = None
    try:
        hosted = build()
        running = start_server(cfg.server, hosted.services)
        if hosted.started is not None:
            hosted.started(running)
        print(f"meshrl {name} serving on {running.address}", flush=True)
        why = wait_for_stop_signal()
        log.info("%s: stopping within %.0fs", why, cfg.server.grace_seconds)
        if hosted.draining is not None:
            hosted.draining(running)
    finally:
        if running is not None:
            running.stop(cfg.server.grace_seconds)
        if hosted is not None and hosted.stopped is not None:
            hosted.stopped()
        telemetry.shutdown_telemetry()
