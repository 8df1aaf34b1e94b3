"""How a GenerateBatch waits on its requests (RolloutReplica._run, call_deadline.await_all): all of a batch's
requests are queued in one call, the waiting thread waits once for all of them, an engine error ends the
wait as soon as it happens, and requests aborted by a pause are regenerated together."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from meshrl.common.errors import Cancelled, Internal
from meshrl.rollout.call_deadline import await_all
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.types import FinishReason, GenerationRequest, GenerationResult, SamplingParams


def result(request: GenerationRequest, reason: FinishReason = FinishReason.LENGTH) -> GenerationResult:
    return GenerationResult(request.request_id, list(request.prompt_ids), [7], [-0.5], [3], reason, 3)


class ScriptedEngine:
    """Finishes each request at once; the first submission of the ids in `abort_once` ends with ABORT."""

    def __init__(self, abort_once: set[str] = frozenset()) -> None:
        self.abort_once = set(abort_once)
        self.calls: list[list[str]] = []  # the request ids of each submit_many call

    def submit_many(self, requests):
        self.calls.append([r.request_id for r in requests])
        futures = []
        for r in requests:
            future: Future = Future()
            aborted = r.request_id in self.abort_once
            self.abort_once.discard(r.request_id)
            future.set_result(result(r, FinishReason.ABORT if aborted else FinishReason.LENGTH))
            futures.append(future)
        return futures

    def cancel(self, request_id: str) -> bool:
        return False

    def health(self) -> bool:
        return True


def requests(n: int) -> list[GenerationRequest]:
    return [GenerationRequest([1, 2, i], SamplingParams(max_tokens=1), request_id=f"r{i}") for i in range(n)]


def test_a_batch_is_queued_in_one_call_and_aborted_requests_are_regenerated_together():
    engine = ScriptedEngine(abort_once={"r1", "r4"})
    replica = RolloutReplica(engine, replica_id="t", capacity=8)
    results = replica._run(requests(6), alive=lambda: True)
    assert engine.calls == [["r0", "r1", "r2", "r3", "r4", "r5"], ["r1", "r4"]]
    assert [r.request_id for r in results] == [f"r{i}" for i in range(6)]
    assert all(r.finish_reason == FinishReason.LENGTH for r in results)


def test_an_engine_error_ends_the_wait_while_earlier_requests_still_run():
    running, failed = Future(), Future()
    failed.set_exception(Internal("generation failed: boom"))
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            await_all([running, failed], lambda: True, lambda: None)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            raised.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(30)  # a hang guard: the old wait polled the first (running) request until it finished
    running.set_result(None)
    assert not waiter.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], Internal) and "boom" in str(raised[0])


def test_a_caller_that_left_cancels_the_batch():
    cancelled: list[bool] = []
    with pytest.raises(Cancelled, match="cancelled or its deadline passed"):
        await_all([Future()], lambda: False, lambda: cancelled.append(True))
    assert cancelled == [True]
