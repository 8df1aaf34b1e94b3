"""What the SGLang and vLLM engines share: a server (launched or given), streamed generation over
HTTP with per-token weight versions, pause gating, in-place continuation, status and shutdown.

`SGLangEngine` and `VLLMEngine` subclass `HTTPEngine` and supply the request body, the parsing
of one streamed event and the control endpoints of their pinned version. Each request runs in a
worker thread that reads the server's server-sent events; tokens are stamped with the weight
version the server reports (SGLang) or the one the adapter loaded (vLLM).
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

from meshrl.common.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, MeshrlError, Unavailable
from meshrl.common.net import free_port
from meshrl.rollout.config import EngineConfig, HTTPEngineConfig
from meshrl.rollout.engine import ChunkCallback, Engine
from meshrl.rollout.http_server import ServerProcess, wait_healthy
from meshrl.rollout.http_stream import Event, StreamState, read_model_facts, sse_payloads, with_max_tokens
from meshrl.rollout.types import (
    EngineStatus,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    PauseMode,
    SamplingParams,
    TokenChunk,
)

log = logging.getLogger(__name__)
RATE_WINDOW_S = 5.0


@dataclass
class _Running:
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


class HTTPEngine(Engine):
    """Drives an engine server over HTTP. Subclasses set `name` and implement the abstract hooks."""

    health_path = "/health"

    def __init__(self, config: EngineConfig, section: HTTPEngineConfig) -> None:
        self.config = config
        self.section = section
        self._model_path = config.model_path
        self._context, self._vocab, self.tokenizer = read_model_facts(config.model_path, config.context_length)
        headers = {"Authorization": f"Bearer {section.api_key}"} if section.api_key else {}
        # one connection per request in flight (httpx's default pool of 100 held a batch of 1,024 samples to 100
        # at the server at a time), and a few for control calls made meanwhile
        limits = httpx.Limits(
            max_connections=config.max_batch_size + 8, max_keepalive_connections=config.max_batch_size
        )
        timeout = httpx.Timeout(section.request_timeout_s, connect=10.0)
        self.client = httpx.Client(headers=headers, timeout=timeout, limits=limits)
        self.process: ServerProcess | None = None
        if section.url:
            self.url = section.url.rstrip("/")
        else:
            port = section.port or free_port(section.host)
            self.url = f"http://{section.host}:{port}"
            self.process = self.launch(port)
        self._version = 0
        self._lock = threading.Condition()
        self._running: dict[str, _Running] = {}
        self._paused_by: set[str] = set()
        self._waiting = 0
        self._events: collections.deque[tuple[float, int]] = collections.deque()
        self._started = time.monotonic()
        self.generated_tokens = 0
        self._pool = ThreadPoolExecutor(max_workers=config.max_batch_size, thread_name_prefix=f"{self.name}-req")
        try:
            wait_healthy(self.client, self.url, timeout=section.startup_timeout_s, process=self.process,
                         path=self.health_path)  # fmt: skip
            self.after_start()
        except BaseException:
            self.shutdown()
            raise

    # --- hooks of each engine -----------------------------------------------------------------
    @abc.abstractmethod
    def launch(self, port: int) -> ServerProcess:
        """Starts the server on `port` (model, flags, environment of this engine)."""

    def after_start(self) -> None:
        """Reads what the adapter needs from the running server (e.g. its weight version)."""

    @abc.abstractmethod
    def generate_path(self) -> str: ...

    @abc.abstractmethod
    def request_body(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> dict[str, Any]: ...

    @abc.abstractmethod
    def parse_event(self, data: dict[str, Any], state: StreamState) -> Event: ...

    @abc.abstractmethod
    def server_pause(self, mode: PauseMode) -> bool:
        """Pauses the server itself; False when this version cannot (the adapter retracts requests instead)."""

    @abc.abstractmethod
    def server_continue(self) -> None: ...

    # --- facts ------------------------------------------------------------------------------------
    @property
    def model_path(self) -> str:
        return self._model_path

    @property
    def context_length(self) -> int:
        return self._context

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def device(self) -> str:
        return "cuda"  # SGLang and vLLM serve from GPUs

    @property
    def weight_ranks(self) -> int:
        """One rank per tensor-parallel worker in a native weight group."""
        return self.section.tensor_parallel_size

    # --- HTTP helpers -----------------------------------------------------------------------------
    def post(
        self, path: str, body: dict[str, Any] | None = None, *, timeout: float | None = None, **kw
    ) -> httpx.Response:
        try:
            reply = self.client.post(
                self.url + path, json=body, timeout=timeout or self.section.request_timeout_s, **kw
            )
        except httpx.TimeoutException as exc:
            raise DeadlineExceeded(f"{self.name} {path} did not answer in time: {exc}") from None
        except httpx.HTTPError as exc:
            raise Unavailable(f"{self.name} server at {self.url} is unreachable ({exc})") from None
        return reply

    def check(self, reply: httpx.Response, what: str) -> dict[str, Any]:
        """The JSON body of a control call; {"success": false} or an HTTP error becomes a typed error."""
        try:
            body = reply.json() if reply.content else {}
        except ValueError:
            body = {"message": reply.text}
        if not isinstance(body, dict):
            body = {"result": body}
        if reply.status_code >= 400 or body.get("success") is False:
            message = body.get("message") or body.get("detail") or body.get("error") or reply.text
            cls = InvalidArgument if reply.status_code in (400, 422) else FailedPrecondition
            if reply.status_code >= 500:
                cls = Unavailable
            raise cls(f"{self.name} refused {what}: {message}")
        return body

    # --- generation -------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, on_chunk: ChunkCallback | None = None) -> Future[GenerationResult]:
        self.validate(request)
        future: Future = Future()
        with self._lock:
            if request.request_id in self._running:
                raise InvalidArgument(f"request id {request.request_id!r} is already running; use a unique id")
            run = _Running(request, future, on_chunk, self._version)
            self._running[request.request_id] = run
        self._pool.submit(self._drive, run)
        return future

    def _wait_open(self, run: _Running) -> bool:
        """Blocks while generation is paused; False when the request was aborted meanwhile."""
        with self._lock:
            self._waiting += 1
            try:
                while self._paused_by and not run.abort:
                    self._lock.wait(0.5)
            finally:
                self._waiting -= 1
            return not run.abort

    def _drive(self, run: _Running) -> None:
        try:
            finish = self._generate(run)
        except MeshrlError as exc:
            self._forget(run)
            run.future.set_exception(exc)
            return
        except Exception as exc:  # noqa: BLE001 - reported on the request's future
            self._forget(run)
            run.future.set_exception(Unavailable(f"{self.name} request failed: {type(exc).__name__}: {exc}"))
            return
        self._finish(run, finish)

    def _generate(self, run: _Running) -> FinishReason:
        sampling = run.request.sampling
        while True:
            if not self._wait_open(run):
                return FinishReason.ABORT
            run.retract = False
            prompt = [int(t) for t in run.request.prompt_ids] + run.tokens
            remaining = sampling.max_tokens - len(run.tokens)
            body = self.request_body(prompt, with_max_tokens(sampling, remaining), run.request.request_id)
            finish = self._stream_once(run, body)
            if finish is not None:
                return finish
            if run.abort:
                return FinishReason.ABORT
            if not run.retract:
                raise Unavailable(f"{self.name} ended the stream of {run.request.request_id} without a finish reason")
            # retracted by an in-place pause: continue from the tokens so far once generation resumes

    def _stream_once(self, run: _Running, body: dict[str, Any]) -> FinishReason | None:
        state = StreamState()
        try:
            with self.client.stream("POST", self.url + self.generate_path(), json=body) as response:
                run.response = response
                if response.status_code >= 400:
                    response.read()
                    self.check(response, f"request {run.request.request_id}")
                for data in sse_payloads(response.iter_lines()):
                    if run.abort or run.retract:
                        return None
                    if "error" in data:
                        raise InvalidArgument(f"{self.name} failed request {run.request.request_id}: {data['error']}")
                    event = self.parse_event(data, state)
                    self._record(run, event)
                    if event.finish is not None:
                        if event.finish == FinishReason.ABORT and run.retract:
                            return None
                        return event.finish
        except httpx.HTTPError as exc:
            if run.abort or run.retract:
                return None
            raise Unavailable(f"{self.name} stream of {run.request.request_id} broke: {exc}") from None
        finally:
            run.response = None
        return None

    def _record(self, run: _Running, event: Event) -> None:
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

    def _forget(self, run: _Running) -> None:
        with self._lock:
            self._running.pop(run.request.request_id, None)
            self._lock.notify_all()

    def _finish(self, run: _Running, finish: FinishReason) -> None:
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

    def _close_streams(self, runs: Sequence[_Running]) -> None:
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
        self._close_streams([run])
        return True

    # --- control ----------------------------------------------------------------------------------
    def pause(self, mode: PauseMode = PauseMode.IN_PLACE, reason: str = "user") -> int:
        with self._lock:
            self._paused_by.add(reason)
            runs = list(self._running.values())
        if mode == PauseMode.ABORT:
            for run in runs:
                run.abort = True
            self.server_pause(mode)
            self._close_streams(runs)
            return len(runs)
        if not self.server_pause(mode):
            for run in runs:
                run.retract = True  # continued after the pause with the tokens made so far
            self._close_streams(runs)
        return 0

    def continue_generation(self, reason: str = "user") -> None:
        with self._lock:
            self._paused_by.discard(reason)
            still_paused = bool(self._paused_by)
            self._lock.notify_all()
        if not still_paused:
            self.server_continue()

    def health(self) -> bool:
        if self.process is not None and not self.process.alive():
            return False
        try:
            return self.client.get(self.url + self.health_path, timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def status(self) -> EngineStatus:
        now = time.monotonic()
        with self._lock:
            recent = sum(n for t, n in self._events if now - t <= RATE_WINDOW_S)
            running = len(self._running) - self._waiting
            waiting = self._waiting
        return EngineStatus(
            engine=self.name,
            model_path=self.model_path,
            weight_version=self._version,
            queue_depth=waiting,
            running_requests=max(0, running),
            tokens_per_second=recent / min(RATE_WINDOW_S, max(now - self._started, 1e-3)),
            generated_tokens=self.generated_tokens,
            paused=bool(self._paused_by),
            healthy=self.health(),
        )

    def tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise FailedPrecondition(f"the model folder {self.model_path} has no tokenizer; send prompt_ids instead")
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids)) if self.tokenizer is not None else ""

    def shutdown(self) -> None:
        with self._lock:
            runs = list(self._running.values())
            for run in runs:
                run.abort = True
            self._lock.notify_all()
        self._close_streams(runs)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.process is not None:
            self.process.stop()
        self.client.close()
