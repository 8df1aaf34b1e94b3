"""Continuous batching for the transformers engine: one thread owns the model and decodes every
running request together, one token per step; new requests join between steps.

`TransformersEngine` owns one `ContinuousBatcher`. Callers get a Future per request. Control
operations (pause, continue, cancel, cache flush, weight copies) run on the batcher thread
between two steps (`run_exclusive`), so a weight update never races a forward pass, and every
token is stamped with the weight version of the forward pass that produced it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from meshrl.common.errors import Internal, Unavailable
from meshrl.rollout.kv_batch import KVBatch, SeqKV
from meshrl.rollout.model_runner import HFModelRunner
from meshrl.rollout.prefix_cache import PrefixCache
from meshrl.rollout.sampler import sample, sample_key
from meshrl.rollout.types import FinishReason, GenerationRequest, GenerationResult, PauseMode, TokenChunk

log = logging.getLogger(__name__)
T = TypeVar("T")
RATE_WINDOW_S = 5.0


@dataclass
class _Seq:
    request: GenerationRequest
    future: Future
    on_chunk: Callable[[TokenChunk], None] | None
    key: int  # the sampling noise's key (meshrl.rollout.sampler.sample_key)
    stop_ids: frozenset[int]
    admitted_version: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    recompute: bool = False  # its KV was flushed: re-prefill prompt + tokens[:-1], keep the pending token

    @property
    def prompt(self) -> list[int]:
        return [int(t) for t in self.request.prompt_ids]


class ContinuousBatcher:
    def __init__(
        self,
        runner: HFModelRunner,
        *,
        max_batch_size: int = 64,
        max_admit_per_step: int = 64,
        prefix_cache_tokens: int = 65536,
        max_prefill_tokens: int = 8192,
        initial_version: int = 0,
    ) -> None:
        self.runner = runner
        self.max_prefill_tokens = max_prefill_tokens
        self.max_batch_size = max_batch_size
        self.max_admit_per_step = max_admit_per_step
        self.prefix = PrefixCache(prefix_cache_tokens)
        self.version = initial_version
        self.generated_tokens = 0
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._rows: list[_Seq] = []
        self._batch = KVBatch.empty(runner.device)
        self._commands: collections.deque[tuple[Callable[[], Any], Future]] = collections.deque()
        self._paused_by: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stopping = False
        self._events: collections.deque[tuple[float, int]] = collections.deque()
        self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="rollout-batcher", daemon=True)

    # --- called from any thread ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, request: GenerationRequest, on_chunk: Callable[[TokenChunk], None] | None) -> Future:
        return self.submit_many([request], on_chunk)[0]

    def submit_many(
        self, requests: Sequence[GenerationRequest], on_chunk: Callable[[TokenChunk], None] | None = None
    ) -> list[Future]:
        """Queues every request at once (one wake-up of the batcher thread), so they join the same step
        rather than trickling in while the first ones prefill and decode."""
        seqs = []
        for request in requests:
            stop = set(request.sampling.stop_token_ids)
            if not request.sampling.ignore_eos:
                stop |= self.runner.eos_token_ids
            seqs.append(_Seq(request, Future(), on_chunk, sample_key(request.sampling), frozenset(stop), 0))
        with self._wake:
            if self._stopping:
                raise Unavailable("the engine is shutting down; send the request to another replica")
            self._waiting.extend(seqs)
            self._wake.notify()
        return [seq.future for seq in seqs]

    def run_exclusive(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Runs `fn` on the batcher thread between two steps and returns its result (or raises its error)."""
        future: Future = Future()
        with self._wake:
            if self._stopping:
                raise Unavailable("the engine is shutting down")
            self._commands.append((fn, future))
            self._wake.notify()
        return future.result(timeout=timeout)

    def pause(self, mode: PauseMode, reason: str = "user") -> int:
        def op() -> int:
            self._paused_by.add(reason)
            if mode == PauseMode.ABORT:
                return self._abort_all()
            return 0

        return self.run_exclusive(op)

    def resume(self, reason: str = "user") -> None:
        self.run_exclusive(lambda: self._paused_by.discard(reason))

    def cancel(self, request_id: str) -> bool:
        return self.run_exclusive(lambda: self._cancel(request_id))

    def flush(self) -> bool:
        return self.run_exclusive(self.drop_cache)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def paused(self) -> bool:
        return bool(self._paused_by)

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._rows)

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        events = list(self._events)
        recent = sum(n for t, n in events if now - t <= RATE_WINDOW_S)
        window = min(RATE_WINDOW_S, max(now - self._started_at, 1e-3))
        return recent / window

    def stop(self, timeout: float = 10.0) -> None:
        """Aborts every request (FinishReason.ABORT) and ends the thread."""
        with self._wake:
            if self._stopping:
                return
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout)

    # --- the batcher thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._commands and (self.paused or not (self._waiting or self._rows)):
                    self._wake.wait(timeout=1.0)
                if self._stopping:
                    break
                commands = list(self._commands)
                self._commands.clear()
            for fn, future in commands:
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)
            if self.paused:
                continue
            try:
                self._admit()
                if self._rows:
                    self._decode_step()
            except Exception as exc:  # noqa: BLE001 - fail the batch, keep serving
                log.exception("generation step failed")
                self._fail_all(Internal(f"generation failed: {type(exc).__name__}: {exc}"))
        self._abort_all()
        for _, future in list(self._commands):
            future.set_exception(Unavailable("the engine stopped"))

    def _admit(self) -> None:
        room = min(self.max_admit_per_step, self.max_batch_size - len(self._rows))
        admitted: list[_Seq] = []
        with self._lock:
            while self._waiting and len(admitted) < room:
                admitted.append(self._waiting.popleft())
        admitted = [seq for seq in admitted if not seq.future.done()]
        if not admitted:
            return
        # What to run: the whole prompt (fresh), or prompt + tokens but the pending one (KV flushed).
        wanted = {id(seq): tuple(seq.prompt + (seq.tokens[:-1] if seq.recompute else [])) for seq in admitted}
        flushed = {wanted[id(seq)] for seq in admitted if seq.recompute}
        ready: dict[tuple[int, ...], tuple[SeqKV, torch.Tensor]] = {}
        misses: list[tuple[int, ...]] = []
        for seq in admitted:
            tokens = wanted[id(seq)]
            if tokens in ready or tokens in misses:
                continue
            hit = None if seq.recompute else self.prefix.lookup(tokens)
            if hit is not None and hit.length == len(tokens) and hit.entry.logits is not None:
                ready[tokens] = (hit.entry.kv, hit.entry.logits)
            elif hit is not None:
                ready[tokens] = self.runner.prefill(tokens, prefix=hit.entry.kv)
                self.prefix.insert(tokens, *ready[tokens])
            else:
                misses.append(tokens)
        for group in _by_token_budget(misses, self.max_prefill_tokens):
            for tokens, (kv, logits) in zip(group, self.runner.prefill_many(group)):
                ready[tokens] = (kv, logits)
                if tokens not in flushed:
                    self.prefix.insert(tokens, kv, logits)
        joining: list[tuple[_Seq, SeqKV]] = []
        fresh: list[tuple[_Seq, SeqKV, torch.Tensor]] = []
        for seq in admitted:
            kv, logits = ready[wanted[id(seq)]]
            if seq.recompute:
                seq.recompute = False
                joining.append((seq, kv))
            else:
                seq.admitted_version = self.version
                fresh.append((seq, kv, logits))
        if fresh:
            stacked = torch.stack([lg for _, _, lg in fresh])
            seqs = [s for s, _, _ in fresh]
            tokens, logprobs = sample(
                stacked, [s.request.sampling for s in seqs], [s.key for s in seqs], [len(s.tokens) for s in seqs]
            )
            self._count(len(fresh))
            for (seq, kv, _), tok, lp in zip(fresh, tokens, logprobs):
                if self._append_token(seq, tok, lp) is None:
                    joining.append((seq, kv))
        if joining:
            self._batch.append_rows([kv for _, kv in joining], [kv[0][0].shape[2] for _, kv in joining])
            self._rows.extend(seq for seq, _ in joining)

    def _decode_step(self) -> None:
        pending = torch.tensor([seq.tokens[-1] for seq in self._rows], dtype=torch.long)
        logits = self.runner.decode(self._batch, pending)
        rows = self._rows
        tokens, logprobs = sample(
            logits, [s.request.sampling for s in rows], [s.key for s in rows], [len(s.tokens) for s in rows]
        )
        self._count(len(tokens))
        keep = []
        for i, (seq, tok, lp) in enumerate(zip(self._rows, tokens, logprobs)):
            reason = self._append_token(seq, tok, lp)
            if reason is None:
                keep.append(i)
            elif seq.request.session_id and self.prefix.max_tokens > 0:
                # The next turn of this session starts with this whole conversation: keep its KV.
                self.prefix.insert(seq.prompt + seq.tokens[:-1], self._batch.row_kv(i), None)
        if len(keep) != len(self._rows):
            self._rows = [self._rows[i] for i in keep]
            self._batch.select_rows(keep)

    def _append_token(self, seq: _Seq, token: int, logprob: float) -> FinishReason | None:
        """Records a sampled token; finishes the request (and returns why) when it ended."""
        seq.tokens.append(token)
        seq.logprobs.append(logprob)
        seq.versions.append(self.version)
        reason = None
        if token in seq.stop_ids:
            reason = FinishReason.STOP
        elif len(seq.tokens) >= seq.request.sampling.max_tokens:
            reason = FinishReason.LENGTH
        elif len(seq.request.prompt_ids) + len(seq.tokens) >= self.runner.context_length:
            reason = FinishReason.LENGTH
        self._notify(seq, TokenChunk([token], [logprob], [self.version], reason))
        if reason is not None:
            self._finish(seq, reason)
        return reason

    def _notify(self, seq: _Seq, chunk: TokenChunk) -> None:
        if seq.on_chunk is None:
            return
        try:
            seq.on_chunk(chunk)
        except Exception:  # noqa: BLE001 - a broken listener must not stop the batch
            log.exception("chunk listener of request %s failed", seq.request.request_id)

    def _finish(self, seq: _Seq, reason: FinishReason) -> None:
        if seq.future.done():
            return
        seq.future.set_result(
            GenerationResult(
                request_id=seq.request.request_id,
                prompt_ids=seq.prompt,
                token_ids=list(seq.tokens),
                logprobs=list(seq.logprobs),
                weight_versions=list(seq.versions),
                finish_reason=reason,
                weight_version=seq.admitted_version if seq.tokens else self.version,
            )
        )

    def _count(self, n: int) -> None:
        now = time.monotonic()
        self.generated_tokens += n
        self._events.append((now, n))
        while self._events and now - self._events[0][0] > RATE_WINDOW_S:
            self._events.popleft()

    def _abort_all(self) -> int:
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
        victims = self._rows + waiting
        for seq in victims:
            self._notify(seq, TokenChunk([], [], [], FinishReason.ABORT))
            self._finish(seq, FinishReason.ABORT)
        self._rows = []
        self._batch = KVBatch.empty(self.runner.device)
        return len(victims)

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
        for seq in self._rows + waiting:
            if not seq.future.done():
                seq.future.set_exception(error)
        self._rows = []
        self._batch = KVBatch.empty(self.runner.device)

    def _cancel(self, request_id: str) -> bool:
        for i, seq in enumerate(self._rows):
            if seq.request.request_id == request_id:
                self._notify(seq, TokenChunk([], [], [], FinishReason.ABORT))
                self._finish(seq, FinishReason.ABORT)
                keep = [j for j in range(len(self._rows)) if j != i]
                self._rows = [self._rows[j] for j in keep]
                self._batch.select_rows(keep)
                return True
        with self._lock:
            for seq in self._waiting:
                if seq.request.request_id == request_id:
                    self._waiting.remove(seq)
                    break
            else:
                return False
        self._notify(seq, TokenChunk([], [], [], FinishReason.ABORT))
        self._finish(seq, FinishReason.ABORT)
        return True

    def drop_cache(self) -> bool:
        """Drops the prefix cache and the running rows' KV; they re-prefill on the next step (current weights).

        Call it on the batcher thread (inside `run_exclusive`); `flush` does that for other threads."""
        self.prefix.clear()
        if self._rows:
            for seq in self._rows:
                seq.recompute = True
            with self._lock:
                self._waiting.extendleft(reversed(self._rows))
            self._rows = []
            self._batch = KVBatch.empty(self.runner.device)
        return True


def _by_token_budget(prompts: list[tuple[int, ...]], budget: int) -> list[list[tuple[int, ...]]]:
    """Splits prompts into groups whose padded size (rows x longest) stays within `budget` tokens."""
    groups: list[list[tuple[int, ...]]] = []
    current: list[tuple[int, ...]] = []
    longest = 0
    for p in sorted(prompts, key=len):
        if current and (len(current) + 1) * max(longest, len(p)) > budget:
            groups.append(current)
            current, longest = [], 0
        current.append(p)
        longest = max(longest, len(p))
    if current:
        groups.append(current)
    return groups
