"""Waiting for a generation while the caller is still there: a GenerateBatch whose caller cancelled or whose
deadline passed stops, and its requests are cancelled in the engine so no work is spent on them.

Called by `RolloutReplica._run`; `alive` is the gRPC context's `is_active` (None in-process: wait forever).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future

from meshrl.common.errors import Cancelled
from meshrl.rollout.types import GenerationRequest, GenerationResult

POLL_SECONDS = 0.1


def await_result(
    future: Future[GenerationResult], alive: Callable[[], bool] | None, cancel: Callable[[], None]
) -> GenerationResult:
    """The future's result; when `alive()` turns False first, runs `cancel` and raises Cancelled."""
    if alive is None:
        return future.result()
    while True:
        try:
            return future.result(timeout=POLL_SECONDS)
        except TimeoutError:
            if not alive():
                cancel()
                raise Cancelled(
                    "the caller cancelled or its deadline passed: generation stopped and its requests were cancelled"
                ) from None


def cancel_all(engine, requests: Sequence[GenerationRequest]) -> Callable[[], None]:
    def cancel() -> None:
        for r in requests:
            engine.cancel(r.request_id)

    return cancel
