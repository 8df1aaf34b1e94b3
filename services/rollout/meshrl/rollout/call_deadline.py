"""Waiting for a generation while the caller is still there: a GenerateBatch whose caller cancelled or whose
deadline passed stops, and its requests are cancelled in the engine so no work is spent on them.

Called by `RolloutReplica._run`; `alive` is the gRPC context's `is_active` (None in-process: wait forever).
A batch's futures are awaited together: the waiting thread wakes once, when the last one is done (or one
failed), not once per request while the batcher thread is still finishing the others (and every POLL_SECONDS
to ask `alive`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from meshrl.common.errors import Cancelled
from meshrl.rollout.types import GenerationRequest, GenerationResult

POLL_SECONDS = 0.1


def await_all(
    futures: Sequence[Future[GenerationResult]], alive: Callable[[], bool] | None, cancel: Callable[[], None]
) -> list[GenerationResult]:
    """Every future's result, in order; the first failure is raised as soon as it happens; when `alive()` turns
    False first, runs `cancel` and raises Cancelled. One done-callback per future counts them down (no wait
    that re-registers on every future at each poll: a batch holds up to `limits.max_samples` of them)."""
    settled = threading.Event()
    lock = threading.Lock()
    left = [len(futures)]

    def finished(future: Future) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last or future.cancelled() or future.exception() is not None:
            settled.set()

    for future in futures:
        future.add_done_callback(finished)
    while futures and not settled.wait(None if alive is None else POLL_SECONDS):
        if not alive():
            cancel()
            raise Cancelled(
                "the caller cancelled or its deadline passed: generation stopped and its requests were cancelled"
            )
    for future in futures:
        if future.done() and (future.cancelled() or future.exception() is not None):
            future.result()  # raises the engine's error
    return [f.result() for f in futures]


def cancel_all(engine, requests: Sequence[GenerationRequest]) -> Callable[[], None]:
    def cancel() -> None:
        for r in requests:
            engine.cancel(r.request_id)

    return cancel
