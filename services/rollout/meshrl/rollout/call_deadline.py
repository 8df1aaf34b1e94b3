"""Waiting for a generation while the caller is still there: a GenerateBatch whose caller cancelled or whose
deadline passed stops, and its requests are cancelled in the engine so no work is spent on them.

Called by `RolloutReplica._run`; `alive` is the gRPC context's `is_active` (None in-process: wait forever).
A batch's futures are awaited together: the waiting thread wakes once, when the last one is done (or one
failed), not once per request while the batcher thread is still finishing the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait

from meshrl.common.errors import Cancelled
from meshrl.rollout.types import GenerationRequest, GenerationResult

POLL_SECONDS = 0.1


def await_all(
    futures: Sequence[Future[GenerationResult]], alive: Callable[[], bool] | None, cancel: Callable[[], None]
) -> list[GenerationResult]:
    """Every future's result, in order, after one wait for all of them; the first failure is raised as soon
    as it happens; when `alive()` turns False first, runs `cancel` and raises Cancelled."""
    while True:
        _, pending = wait(futures, timeout=None if alive is None else POLL_SECONDS, return_when=FIRST_EXCEPTION)
        for future in futures:
            if future.done() and future.exception() is not None:
                future.result()  # raises the engine's error
        if not pending:
            return [f.result() for f in futures]
        if alive is not None and not alive():
            cancel()
            raise Cancelled(
                "the caller cancelled or its deadline passed: generation stopped and its requests were cancelled"
            )


def cancel_all(engine, requests: Sequence[GenerationRequest]) -> Callable[[], None]:
    def cancel() -> None:
        for r in requests:
            engine.cancel(r.request_id)

    return cancel
