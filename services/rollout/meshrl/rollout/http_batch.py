"""A whole batch over one server call: where the engine server has a batch route (`batch_path`), `submit_many`
sends every request of the batch (the samples of one prompt still sharing one server request) in one HTTP call
and one worker thread reads the reply, newline-delimited JSON with several requests' tokens per line.

What a request of such a batch gets is what a request of its own gets: its tokens, log-probs and weight
versions, its future completed when it finishes (not when the batch does), generation gated while paused,
cancel (the server is asked to abort that request; the batch goes on), an abort pause, and a request the reply
did not finish going on as a request of its own. `BatchedRequests` is a mixin of `StreamedRequests`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx

from meshrl.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from meshrl.rollout.http_stream import Event, checked
from meshrl.rollout.types import FinishReason

if TYPE_CHECKING:
    from meshrl.rollout.http_requests import Running


class BatchedRequests:
    """The batch half of `StreamedRequests`: engines with a batch route implement the three hooks below."""

    def batch_path(self) -> str | None:
        """The server's batch route, or None when it has none (each request streams on its own)."""
        return None

    def batch_body(self, batch: Sequence[Sequence[Running]]) -> dict[str, Any]:
        """The body of one batch call: one server request per group of `batch` (its samples share it)."""
        raise NotImplementedError

    def parse_batch_line(self, data: dict[str, Any]) -> list[tuple[int, int, Event | str]]:
        """(group index, sample index, Event) per item of one reply line; an error item's Event is its reason."""
        raise NotImplementedError

    def abort_on_server(self, server_request_ids: list[str]) -> None:
        """Asks the server to abort requests of running batches (their streams go on for the others)."""
        raise NotImplementedError

    def _abort_soon(self, server_request_id: str) -> None:
        """Queues an abort for the server; one worker sends the queued ones together (a whole batch cancelled
        request by request costs a call or two, and cancel never waits on the server)."""
        with self._lock:
            self._aborts.append(server_request_id)
            if self._aborts_queued:
                return
            self._aborts_queued = True
        self._pool.submit(self._send_aborts)

    def _send_aborts(self) -> None:
        with self._lock:
            ids, self._aborts, self._aborts_queued = self._aborts, [], False
        if ids:
            self.abort_on_server(ids)

    def _drive_batch(self, batch: list[list[Running]]) -> None:
        state = BatchState(batch)
        complete = False
        try:
            if self._wait_open(state.runs):
                for run in state.runs:
                    run.retract = False
                live = [group for group in batch if not all(run.abort for run in group)]  # cancelled: not sent
                if live:
                    complete = self._read_batch(BatchState(live, state.done))
        except Exception as exc:  # noqa: BLE001 - reported on each unfinished request's future
            for run in state.runs:
                if id(run) not in state.done:
                    self._fail(run, exc)
            return
        for run in state.runs:
            if id(run) in state.done:
                continue
            if run.abort:
                self._finish(run, FinishReason.ABORT)
            elif complete or run.retract:
                run.group, run.batch = None, None  # a request of its own from here on
                self._pool.submit(self._drive, run)
            else:
                self._fail(run, Unavailable(f"{self.name} ended a batch before {run.request.request_id} finished"))

    def _read_batch(self, state: BatchState) -> bool:
        """Reads the reply into the batch's requests, finishing each as its end arrives; True when the server
        said the batch is done (False: the stream ended or was closed early, e.g. by an abort pause)."""
        try:
            with self.client.stream("POST", self.url + self.batch_path(), json=self.batch_body(state.batch)) as reply:
                for run in state.runs:
                    run.response = reply
                if reply.status_code >= 400:
                    reply.read()
                    checked(reply, f"{self.name} refused {state.what}")
                for line in reply.iter_lines():
                    if not line:
                        continue
                    try:
                        data = json.loads(line)
                    except ValueError:
                        raise Unavailable(f"{self.name} sent a batch line that is not JSON: {line[:200]}") from None
                    if data.get("done"):
                        return True
                    for i, k, event in self.parse_batch_line(data):
                        self._batch_item(state, i, k, event)
        except httpx.HTTPError as exc:
            if all(run.abort or run.retract or id(run) in state.done for run in state.runs):
                return False
            raise Unavailable(f"{self.name} stream of {state.what} broke: {exc}") from None
        finally:
            for run in state.runs:
                run.response = None
        return False

    def _batch_item(self, state: BatchState, i: int, k: int, event: Event | str) -> None:
        if not 0 <= i < len(state.batch):
            raise FailedPrecondition(f"{self.name} sent request {i} of {state.what}")
        group = state.batch[i]
        if isinstance(event, str):  # the server failed this request (e.g. a prompt that does not fit)
            for run in group:
                if id(run) not in state.done:
                    state.done.add(id(run))
                    self._fail(run, InvalidArgument(f"{self.name} failed {run.request.request_id}: {event}"))
            return
        if not 0 <= k < len(group):
            raise FailedPrecondition(f"{self.name} sent sample {k} of request {i} of {state.what}")
        run = group[k]
        if id(run) in state.done or run.retract:
            return  # a retracted request goes on as a request of its own after the pause
        if run.abort and event.finish is None:
            if id(run) not in state.aborted_again and (run.group is None or all(r.abort for r in run.group)):
                state.aborted_again.add(id(run))
                self._abort_soon(run.server_id)  # its cancel may have reached the server before the request
            return
        if not run.abort:
            self._record(run, event)
        if event.finish is not None:
            state.done.add(id(run))
            self._finish(run, FinishReason.ABORT if run.abort else event.finish)


class BatchState:
    """One batch call: its groups (a server request each), their requests, and which of them ended."""

    def __init__(self, batch: list[list[Running]], done: set[int] | None = None) -> None:
        self.batch = batch
        self.runs = [run for group in batch for run in group]
        self.done: set[int] = done if done is not None else set()  # id() of the requests finished or failed
        self.aborted_again: set[int] = set()
        self.what = f"a batch of {len(self.runs)} requests"
