"""What the SGLang and vLLM engines share: a server (launched or given), its control calls (pause, continue),
facts, status and shutdown; streamed generation comes from `StreamedRequests` (http_requests).

`SGLangEngine` and `VLLMEngine` subclass `HTTPEngine` and supply the request body, the parsing
of one streamed event and the control endpoints of their pinned version.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx

from meshrl.common.errors import DeadlineExceeded, FailedPrecondition, Unavailable
from meshrl.common.net import free_port
from meshrl.rollout.config import EngineConfig, HTTPEngineConfig
from meshrl.rollout.http_requests import RATE_WINDOW_S, StreamedRequests
from meshrl.rollout.http_server import ServerProcess, wait_healthy
from meshrl.rollout.http_stream import checked, read_model_facts
from meshrl.rollout.types import EngineStatus, PauseMode

log = logging.getLogger(__name__)


class HTTPEngine(StreamedRequests):
    """Drives an engine server over HTTP. Subclasses set `name` and implement the abstract hooks."""

    health_path = "/health"

    def __init__(self, config: EngineConfig, section: HTTPEngineConfig) -> None:
        super().__init__(max_requests=config.max_batch_size)
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
        try:
            wait_healthy(
                self.client, self.url, timeout=section.startup_timeout_s, process=self.process, path=self.health_path
            )
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
        return checked(reply, f"{self.name} refused {what}")

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
