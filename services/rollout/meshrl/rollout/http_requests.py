"""Generation over an engine server's streaming endpoint: each request (or the samples of one prompt that share
a request) read by a worker thread from the server-sent events, tokens stamped with their weight version,
gating while generation is paused, continuation from the tokens so far after a retracting pause, cancel.

`StreamedRequests` is the generation half of `HTTPEngine` (which adds the server, its control calls and the
facts); the engines (SGLang, vLLM) supply the request body and the parsing of one event.
"""

from __future__ import annotations

import abc
import collections
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from meshrl.common.errors import FailedPrecondition, InvalidArgument, MeshrlError, Unavailable
from meshrl.rollout.engine import ChunkCallback, Engine
from meshrl.rollout.http_batch import BatchedRequests
from meshrl.rollout.http_groups import sample_groups
from meshrl.rollout.http_stream import Event, StreamState, checked, sse_payloads, with_max_tokens
from meshrl.rollout.types import FinishReason, GenerationRequest, GenerationResult, SamplingParams, TokenChunk

log = logging.getLogger(__name__)
RATE_WINDOW_S = 5.0


@dataclass
class Running:
    request: GenerationRequest
    future: Future
    on_chunk: ChunkCallback | None
    admitted_version: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    response: httpx.Response | None = None
    abort: bool = False  # finish with ABORT
    retract: bool = False  # stop the server request and continue it after the pause (prompt + tokens so far)
    group: list[Running] | None = None  # the samples sharing this one's server request, if it shares one
    batch: list[Running] | None = None  # every request of the batch call this one is part of (http_batch)
    server_id: str = ""  # the id of the server request it is part of, in a batch call


class StreamedRequests(BatchedRequests, Engine):
    """Requests in flight on a server at `url` through `client`; subclasses set `name` and the hooks."""

    name: str
    url: str
    client: httpx.Client

    def __init__(self, max_requests: int) -> None:
        self._version = 0
        self._lock = threading.Condition()
        self._running: dict[str, Running] = {}
        self._paused_by: set[str] = set()
        self._waiting = 0
        self._events: collections.deque[tuple[float, int]] = collections.deque()
        self._started = time.monotonic()
        self.generated_tokens = 0
        self._aborts: list[str] = []  # server requests of running batches to abort (http_batch)
        self._aborts_queued = False
        self._pool = ThreadPoolExecutor(max_workers=max_requests, thread_name_prefix=f"{self.name}-req")

    # --- hooks of each engine -----------------------------------------------------------------
    @abc.abstractmethod
    def generate_path(self) -> str: ...

    @abc.abstractmethod
    def request_body(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str, *, samples: int = 1, live: bool = True
    ) -> dict[str, Any]:
        """One generate request: `samples` > 1 asks for that many samples of the prompt (only where
        `samples_per_request` allows it); `live`: a consumer reads the tokens as they come, so stream each one."""

    def samples_per_request(self) -> int:
        """The most samples of one prompt that may share one server request (1: a request per sample)."""
        return 1

    def sends_seeds(self) -> bool:
        """Whether the server is given each sample's seed (then grouped samples need consecutive seeds)."""
        return True

    @abc.abstractmethod
    def parse_event(self, data: dict[str, Any], state: StreamState) -> Event: ...

    # --- generation -------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, on_chunk: ChunkCallback | None = None) -> Future[GenerationResult]:
        self.validate(request)
        run = self._register(request, on_chunk)
        self._pool.submit(self._drive, run)
        return run.future

    def submit_many(self, requests: Sequence[GenerationRequest]) -> list[Future[GenerationResult]]:
        """Queues a batch; where the engine allows it (`samples_per_request` > 1) the samples of one prompt
        share one server request (see http_groups), and where the server has a batch route the whole batch
        goes as one call (see http_batch)."""
        for request in requests:
            self.validate(request)
        limit = self.samples_per_request()
        if limit <= 1 and not self.batch_path():
            return [self.submit(r) for r in requests]
        runs: list[Running] = []
        try:
            for request in requests:
                runs.append(self._register(request, None))
        except InvalidArgument:  # a request id already running: none of the batch is queued
            for run in runs:
                self._forget(run)
            raise
        groups = sample_groups(requests, seeds_sent=self.sends_seeds(), limit=limit)
        if self.batch_path() and runs:
            batch = [[runs[i] for i in group] for group in groups]
            for members in batch:
                for run in members:
                    run.batch, run.server_id = runs, members[0].request.request_id
                    run.group = members if len(members) > 1 else None
            self._pool.submit(self._drive_batch, batch)
            return [run.future for run in runs]
        for group in groups:
            members = [runs[i] for i in group]
            if len(members) == 1:
                self._pool.submit(self._drive, members[0])
            else:
                for run in members:
                    run.group = members
                self._pool.submit(self._drive_group, members)
        return [run.future for run in runs]

    def _register(self, request: GenerationRequest, on_chunk: ChunkCallback | None) -> Running:
        with self._lock:
            if request.request_id in self._running:
                raise InvalidArgument(f"request id {request.request_id!r} is already running; use a unique id")
            run = Running(request, Future(), on_chunk, self._version)
            self._running[request.request_id] = run
        return run

    def _wait_open(self, runs: Sequence[Running]) -> bool:
        """Blocks while generation is paused; False when every one of `runs` was aborted meanwhile."""
        with self._lock:
            self._waiting += len(runs)
            try:
                while self._paused_by and not all(run.abort for run in runs):
                    self._lock.wait(0.5)
            finally:
                self._waiting -= len(runs)
            return not all(run.abort for run in runs)

    def _drive(self, run: Running) -> None:
        try:
            finish = self._generate(run)
        except Exception as exc:  # noqa: BLE001 - reported on the request's future
            self._fail(run, exc)
            return
        self._finish(run, finish)

    def _fail(self, run: Running, exc: Exception) -> None:
        self._forget(run)
        if not isinstance(exc, MeshrlError):
            exc = Unavailable(f"{self.name} request failed: {type(exc).__name__}: {exc}")
        run.future.set_exception(exc)

    def _generate(self, run: Running) -> FinishReason:
        sampling = run.request.sampling
        while True:
            if not self._wait_open([run]):
                return FinishReason.ABORT
            run.retract = False
            prompt = [int(t) for t in run.request.prompt_ids] + run.tokens
            remaining = sampling.max_tokens - len(run.tokens)
            body = self.request_body(
                prompt, with_max_tokens(sampling, remaining), run.request.request_id, live=run.on_chunk is not None
            )
            finish = self._stream([run], body).get(0)
            if finish is not None:
                return finish
            if run.abort:
                return FinishReason.ABORT
            if not run.retract:
                raise Unavailable(f"{self.name} ended the stream of {run.request.request_id} without a finish reason")
            # retracted by an in-place pause: continue from the tokens so far once generation resumes

    def _drive_group(self, runs: list[Running]) -> None:
        """Generates the samples of one prompt as one server request; a sample it did not finish (retracted by
        a pause, or the stream ended early) goes on as a request of its own from the tokens it has."""
        finished: dict[int, FinishReason] = {}
        try:
            if self._wait_open(runs):
                for run in runs:
                    run.retract = False
                first = runs[0].request
                prompt = [int(t) for t in first.prompt_ids]
                body = self.request_body(prompt, first.sampling, first.request_id, samples=len(runs), live=False)
                finished = self._stream(runs, body)
        except Exception as exc:  # noqa: BLE001 - reported on each sample's future
            for run in runs:
                self._fail(run, exc)
            return
        for i, run in enumerate(runs):
            if i in finished:
                self._finish(run, finished[i])
            elif run.abort:
                self._finish(run, FinishReason.ABORT)
            else:
                run.group = None  # its own stream from here on: cancelling it closes that one
                self._pool.submit(self._drive, run)

    def _stream(self, runs: Sequence[Running], body: dict[str, Any]) -> dict[int, FinishReason]:
        """Reads one server request's events into `runs` (its samples, by the events' index) and returns the
        finish reason of each sample that ended; a sample aborted or retracted meanwhile reads nothing more."""
        state = StreamState()
        finished: dict[int, FinishReason] = {}
        what = f"request {runs[0].request.request_id}" + (f" ({len(runs)} samples)" if len(runs) > 1 else "")
        try:
            with self.client.stream("POST", self.url + self.generate_path(), json=body) as response:
                for run in runs:
                    run.response = response
                if response.status_code >= 400:
                    response.read()
                    checked(response, f"{self.name} refused {what}")
                for data in sse_payloads(response.iter_lines()):
                    if all(run.abort or run.retract for run in runs):
                        return finished
                    if "error" in data:
                        raise InvalidArgument(f"{self.name} failed {what}: {data['error']}")
                    event = self.parse_event(data, state)
                    if not 0 <= event.index < len(runs):
                        raise FailedPrecondition(f"{self.name} sent sample {event.index} of {what}")
                    run = runs[event.index]
                    if run.abort or run.retract:
                        continue
                    self._record(run, event)
                    if event.finish is not None and not (event.finish == FinishReason.ABORT and run.retract):
                        finished[event.index] = event.finish
                        if len(finished) == len(runs):
                            return finished
        except httpx.HTTPError as exc:
            if all(run.abort or run.retract or i in finished for i, run in enumerate(runs)):
                return finished
            raise Unavailable(f"{self.name} stream of {what} broke: {exc}") from None
        finally:
            for run in runs:
                run.response = None
        return finished

    def _record(self, run: Running, event: Event) -> None:
        n = len(event.token_ids)
        if n:
            version = event.version if event.version is not None else self._version
            run.tokens += event.token_ids
            run.logprobs += event.logprobs
            run.versions += [version] * n
            now = time.monotonic()
            with self._lock:
                self.generated_tokens += n
                self._events.append((now, n))
                while self._events and now - self._events[0][0] > RATE_WINDOW_S:
                    self._events.popleft()
        if event.all_versions is not None:
            # the engine's own record of the version of each token it made (the adapter's is read on arrival)
            made = len(event.all_versions)
            if made > len(run.versions):
                raise FailedPrecondition(f"{self.name} reported versions of {made} tokens but sent {len(run.versions)}")
            run.versions[len(run.versions) - made :] = [int(v) for v in event.all_versions]
        if run.on_chunk is not None and n:
            run.on_chunk(TokenChunk(list(event.token_ids), list(event.logprobs), run.versions[-n:]))

    def _forget(self, run: Running) -> None:
        with self._lock:
            self._running.pop(run.request.request_id, None)
            self._lock.notify_all()

    def _finish(self, run: Running, finish: FinishReason) -> None:
        self._forget(run)
        if run.on_chunk is not None:
            run.on_chunk(TokenChunk([], [], [], finish))
        run.future.set_result(
            GenerationResult(
                request_id=run.request.request_id,
                prompt_ids=[int(t) for t in run.request.prompt_ids],
                token_ids=run.tokens,
                logprobs=run.logprobs,
                weight_versions=run.versions,
                finish_reason=finish,
                weight_version=run.admitted_version,
            )
        )

    def _close_streams(self, runs: Sequence[Running]) -> None:
        """Ends the HTTP streams of `runs`: the server aborts a request whose client went away."""
        for run in runs:
            response = run.response
            if response is not None:
                try:
                    response.close()
                except Exception:  # noqa: BLE001 - already closed by the reader
                    log.debug("closing stream of %s", run.request.request_id)

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            run = self._running.get(request_id)
            if run is None:
                return False
            run.abort = True
            self._lock.notify_all()
        if run.batch is not None and not all(r.abort for r in run.batch):
            if run.group is None or all(r.abort for r in run.group):
                self._abort_soon(run.server_id)  # the batch's stream goes on for the other requests
            return True
        if run.group is None or all(r.abort for r in run.group):
            self._close_streams([run])  # a shared stream goes on for the other samples; this one reads no more
        return True
