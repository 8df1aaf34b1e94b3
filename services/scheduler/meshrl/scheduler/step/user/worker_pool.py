"""Worker processes that run user code (reward functions, environments) apart from the scheduler.

Each worker is a spawned process serving one call at a time over a pipe; every call has a timeout. A call
that raises comes back as `UserCodeFailed` (the worker lives on); a call that runs past its timeout gets its
worker killed and restarted and raises `DeadlineExceeded`; a worker that dies mid-call (os._exit, a segfault,
the OOM killer) is restarted and the call raises `Unavailable`. So user code can fail, hang or crash its
process and the job still goes on. Objects (environment instances) live in one worker under a handle; a
restart loses them and later calls on their handles raise `Unavailable`.

Used by `step/user/reward_workers.py` (rewards by group) and `step/user/episodes.py` (environments).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from meshrl.common.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable

_CONTEXT = mp.get_context("spawn")
_START_TIMEOUT_S = 120.0  # a spawned worker imports meshrl before it serves  # no forked copy of the scheduler's threads, gRPC channels or Ray state


class UserCodeFailed(FailedPrecondition):
    """User code raised inside a worker; the message carries its type, message and traceback."""


def _resolve(kind: str, ref: str, allowed: Sequence[str]) -> Any:
    if kind == "reward":
        from meshrl.scheduler.step.scoring.rewards import resolve_reward

        return resolve_reward(ref, allowed)
    from meshrl.scheduler.workflow import resolve_executable

    return resolve_executable(ref, allowed, "environment")


def _serve(conn, allowed: Sequence[str]) -> None:
    """The worker's loop: ("call", kind, ref, args) runs a function; ("open", handle, ref, args) makes an object;
    ("method", handle, name, args) calls one of its methods; ("close", handle) forgets it."""
    objects: dict[int, Any] = {}
    functions: dict[tuple[str, str], Any] = {}
    conn.send(("ready", None))  # started and imported: call timeouts count from here
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        op = message[0]
        try:
            if op == "call":
                _, kind, ref, args = message
                if (kind, ref) not in functions:
                    functions[(kind, ref)] = _resolve(kind, ref, allowed)
                value = functions[(kind, ref)](*args)
            elif op == "open":
                _, handle, ref, args = message
                objects[handle] = obj = _resolve("environment", ref, allowed)(*args)
                value = list(getattr(obj, "tools", None) or [])
            elif op == "method":
                _, handle, name, args = message
                value = getattr(objects[handle], name)(*args)
            else:
                objects.pop(message[1], None)
                value = None
            conn.send(("ok", value))
        except BaseException as exc:  # noqa: BLE001 - any failure of user code goes back to the caller
            conn.send(("err", f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=8)))


@dataclass
class _Worker:
    index: int
    process: Any = None
    conn: Any = None
    generation: int = 0
    restarts: int = 0


@dataclass(frozen=True)
class Handle:
    """An object living in one worker (of one generation: a restart invalidates it)."""

    worker: int
    generation: int
    key: int


class WorkerPool:
    """`size` worker processes; `call_timeout_s` bounds every call unless a call gives its own."""

    def __init__(self, size: int, call_timeout_s: float, allowed_modules: Sequence[str] | None) -> None:
        if size < 1:
            raise InvalidArgument(f"a worker pool needs at least one worker, got size={size}")
        if call_timeout_s <= 0:
            raise InvalidArgument(f"worker call timeout must be positive, got {call_timeout_s}")
        self.call_timeout_s = call_timeout_s
        self.allowed = list(allowed_modules) if allowed_modules is not None else None
        self._workers = [_Worker(i) for i in range(size)]
        self._locks = [threading.Lock() for _ in range(size)]
        self._next = itertools.count()
        self._keys = itertools.count(1)
        self._closed = False
        for w in self._workers:
            self._start(w)

    # -- processes ---------------------------------------------------------------------------
    def _start(self, w: _Worker) -> None:
        from meshrl.scheduler.workflow.executables import default_allowed_modules

        allowed = self.allowed if self.allowed is not None else list(default_allowed_modules())
        parent, child = _CONTEXT.Pipe()
        w.process = _CONTEXT.Process(target=_serve, args=(child, allowed), daemon=True, name=f"meshrl-worker-{w.index}")
        w.process.start()
        child.close()
        w.conn = parent
        w.generation += 1
        try:
            ready = parent.poll(_START_TIMEOUT_S) and parent.recv()[0] == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            w.process.kill()
            raise Unavailable(f"worker process {w.index} did not start within {_START_TIMEOUT_S:g}s")

    def _restart(self, w: _Worker) -> None:
        if w.process is not None and w.process.is_alive():
            w.process.kill()
        if w.process is not None:
            w.process.join(5)
        w.conn.close()
        w.restarts += 1
        self._start(w)

    @property
    def restarts(self) -> int:
        return sum(w.restarts for w in self._workers)

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    # -- calls -------------------------------------------------------------------------------
    def _send(self, index: int, message: tuple, timeout: float | None, what: str, generation: int | None = None):
        if self._closed:
            raise Unavailable("the worker pool is closed")
        w = self._workers[index]
        limit = self.call_timeout_s if timeout is None else timeout
        with self._locks[index]:
            if generation is not None and generation != w.generation:
                raise Unavailable(f"{what}: its worker process was restarted, and the object it held is gone")
            try:
                w.conn.send(message)
                ready = w.conn.poll(limit)
            except (BrokenPipeError, EOFError, OSError):
                ready = None
            if ready is False:
                self._restart(w)
                raise DeadlineExceeded(
                    f"{what} ran past its timeout of {limit:g}s; its worker was killed and restarted"
                )
            try:
                reply = w.conn.recv() if ready else None
            except (EOFError, OSError):
                reply = None
            if reply is None:
                w.process.join(1)
                code = w.process.exitcode
                self._restart(w)
                raise Unavailable(f"{what}: its worker process died (exit code {code}); the worker was restarted")
        if reply[0] == "err":
            raise UserCodeFailed(f"{what} raised {reply[1]}\n{reply[2]}")
        return reply[1]

    def call(self, kind: str, ref: str, args: tuple, timeout: float | None = None) -> Any:
        """Runs function `ref` ("reward": a reward name or ref; else a package.module:function) on a worker."""
        index = next(self._next) % len(self._workers)
        return self._send(index, ("call", kind, ref, args), timeout, f"{kind} {ref}")

    def open(self, ref: str, args: tuple = (), timeout: float | None = None) -> tuple[Handle, list[dict]]:
        """Makes `ref(*args)` (an environment class) in one worker; returns its handle (for `method`) and its
        `tools` attribute (a list of tool descriptions, [] when it has none)."""
        index = next(self._next) % len(self._workers)
        key = next(self._keys)
        generation = self._workers[index].generation
        tools = self._send(index, ("open", key, ref, args), timeout, f"environment {ref}", generation)
        return Handle(index, generation, key), tools

    def method(self, handle: Handle, name: str, args: tuple = (), timeout: float | None = None) -> Any:
        return self._send(
            handle.worker, ("method", handle.key, name, args), timeout, f"environment.{name}", handle.generation
        )

    def close_object(self, handle: Handle) -> None:
        try:
            self._send(handle.worker, ("close", handle.key), None, "environment.close", handle.generation)
        except Unavailable:
            pass  # its worker was restarted: the object is gone already

    def close(self) -> None:
        self._closed = True
        for w in self._workers:
            try:
                w.conn.close()
            except OSError:
                pass
            w.process.join(2)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(2)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
