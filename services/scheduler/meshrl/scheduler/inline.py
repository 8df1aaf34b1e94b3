"""Running a call in the calling thread with the outcome a pool would give: a finished Future.

Used where the scheduler would hand a lone call to a thread pool (a step's only runnable node in
meshrl.scheduler.step.dag.executor, one replica's weight load in meshrl.scheduler.fleet.weight_sync): running it here
saves a thread start and two hand-offs, and the caller keeps waiting on futures as it does for the pooled case.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


def run_inline(fn: Callable[..., Any], *args: Any) -> Future:
    """`fn(*args)` now, in a copy of this thread's context (as a pool thread would run it); its result or
    exception in a done Future."""
    done: Future = Future()
    try:
        done.set_result(contextvars.copy_context().run(fn, *args))
    except Exception as exc:  # noqa: BLE001 - handed to whoever waits on the future, as a pool's would be
        done.set_exception(exc)
    return done
