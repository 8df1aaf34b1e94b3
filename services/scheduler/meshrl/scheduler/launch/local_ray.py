"""Starting the scheduler's own single-node Ray instance, retrying once when Ray gives up on itself.

Ray waits a fixed 30 s for its raylet to register with the GCS and then raises a bare Exception ("The current
node timed out during startup"), leaving the processes it had started (GCS, raylet, dashboard, monitors)
running. On a saturated machine (2 cores, other jobs running) that happens though nothing is wrong. This
module kills what the failed attempt left (this process's children that name the attempt's temp dir), retries
once, and otherwise fails with a ResourceExhausted error that says what to do, which the job's recovery does
not retry (a restart would only load the machine more). Used by meshrl.scheduler.launch.launcher.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from meshrl.common.errors import ResourceExhausted

log = logging.getLogger(__name__)
RAY_STARTUP_MESSAGE = "timed out during startup"


def init_local_ray(ray: Any, attempts: int = 2, pause_seconds: float = 2.0, **kwargs: Any) -> None:
    """ray.init(**kwargs) for a new local instance (`_temp_dir` its own, fresh folder); a startup timeout is
    cleaned up and retried (attempts in all)."""
    for attempt in range(1, attempts + 1):
        try:
            ray.init(**kwargs)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this one case
            if RAY_STARTUP_MESSAGE not in str(exc):
                raise
            ray.shutdown()
            killed = kill_leftovers(kwargs.get("_temp_dir"))
            if attempt == attempts:
                raise ResourceExhausted(
                    f"Ray's local node did not start in {attempts} attempts ({exc}); the machine is probably "
                    "overloaded. Fix: run the job again when it is less busy, or set services.use_ray: false to "
                    "start the services as plain local processes"
                ) from None
            log.warning(
                "Ray's local node did not start (attempt %d of %d, %d processes it left stopped): retrying",
                attempt,
                attempts,
                killed,
            )
            time.sleep(pause_seconds)


def kill_leftovers(temp_dir: str | None) -> int:
    """SIGKILLs this process's children whose command line names `temp_dir`; returns how many. Nothing
    without a temp dir (a shared default could name another instance) or without /proc."""
    proc = Path("/proc")
    if not temp_dir or not proc.is_dir():
        return 0
    me, killed = os.getpid(), 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
        if ppid == me and temp_dir in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed
