"""The rollout replica's core: one engine, its serving state, and the work the RPCs ask for.

`server.py` converts protos and calls these methods; `__main__` builds the replica, loads the
job's current weights, then registers it as serving. Generation of a prompt batch reads the
prompts from the data buffer and writes one row per sample back to it (see batch_schema).
No gRPC here.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from meshrl.common import batch_schema as S
from meshrl.common import telemetry
from meshrl.common.codec import Batch, Ragged
from meshrl.common.errors import FailedPrecondition, InvalidArgument, MeshrlError, NotFound, Unavailable
from meshrl.common.registry import DRAINING, PAUSED, SERVING, STALE, STARTING, ReplicaInfo
from meshrl.common.telemetry import attributes as A
from meshrl.common.weights import BaseMismatch, GroupSpec
from meshrl.rollout.call_deadline import await_all, cancel_all
from meshrl.rollout.engine import Engine
from meshrl.rollout.limits import RequestLimits
from meshrl.rollout.prompt_batch import BatchJob, BatchStats, batch_output, batch_requests, batch_stats
from meshrl.rollout.stream_slots import StreamSlots
from meshrl.rollout.types import (
    DiskUpdate,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    GroupUpdate,
    PauseMode,
    TokenChunk,
    TornWeights,
    WeightUpdateResult,
)

log = logging.getLogger(__name__)
MAX_ABORT_RETRIES = 100


@dataclass
class ReplicaStatus:
    replica_id: str
    engine: str
    model_path: str
    weight_version: int
    state: str
    queue_depth: int
    running_requests: int
    tokens_per_second: float
    capacity: int
    generated_tokens: int
    device: str = "cpu"
    weight_ranks: int = 1


class RolloutReplica:
    def __init__(
        self,
        engine: Engine,
        *,
        replica_id: str,
        capacity: int,
        databuffer=None,
        buffer_wait_s: float = 30.0,
        limits: RequestLimits | None = None,
    ):
        self.engine = engine
        self.limits = limits or RequestLimits()
        self.replica_id = replica_id
        self.capacity = capacity
        self.databuffer = databuffer  # meshrl.common.databuffer_client.DataBufferClient or None
        self.buffer_wait_s = buffer_wait_s
        self._state = STARTING
        self._user_paused = False
        self._active = 0
        self._idle = threading.Condition()
        self.streams = StreamSlots(self.limits.max_streams, replica_id)

    # --- state ------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        if self._state == SERVING and self._user_paused:
            return PAUSED
        return self._state

    def mark_serving(self) -> None:
        """STARTING → SERVING once the model and the job's weights are loaded (a stale replica stays stale)."""
        if self._state == STARTING:
            self._state = SERVING

    def mark_stale(self) -> None:
        """Takes no traffic until a weight update refits it."""
        self._state = STALE

    def start_draining(self) -> None:
        self._state = DRAINING

    def _enter(self) -> None:
        state = self.state
        if state in (STARTING, STALE, DRAINING):
            why = {
                STARTING: "is still loading its model or weights",
                STALE: "serves stale weights until it is refitted",
                DRAINING: "is draining before it stops",
            }[state]
            raise Unavailable(f"rollout replica {self.replica_id} {why}; send the request to another replica")
        with self._idle:
            self._active += 1

    def _leave(self) -> None:
        with self._idle:
            self._active -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Waits until no generation call runs (drain); False when `timeout` passed first."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._active:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def info(self, address: str) -> ReplicaInfo:
        return ReplicaInfo(
            replica_id=self.replica_id,
            address=address,
            engine=self.engine.name,
            capacity=self.capacity,
            weight_version=self.engine.weight_version,
            state=self.state,
            model_path=self.engine.model_path,
            host=socket.gethostname(),
            pid=os.getpid(),
        )

    # --- generation -------------------------------------------------------------------------------
    def _run(self, requests: Sequence[GenerationRequest], alive=None) -> list[GenerationResult]:
        """Generates every request; a request aborted by a pause is regenerated once generation resumes.
        Stops (Cancelled, every request cancelled) as soon as `alive()` is False."""
        cancel = cancel_all(self.engine, requests)
        results = await_all(self.engine.submit_many(requests), alive, cancel)  # all queued at once: one step
        retries = 0
        while aborted := [i for i, r in enumerate(results) if r.finish_reason == FinishReason.ABORT]:
            retries += 1
            if retries > MAX_ABORT_RETRIES or not self.engine.health():
                raise Unavailable(
                    f"request {requests[aborted[0]].request_id} was aborted {retries} times; retry elsewhere"
                )
            again = await_all(self.engine.submit_many([requests[i] for i in aborted]), alive, cancel)
            for i, result in zip(aborted, again):
                results[i] = result
        return results

    def generate_batch(self, job: BatchJob) -> BatchStats:
        if self.databuffer is None:
            raise FailedPrecondition(
                "this replica has no data buffer (databuffer_address is unset); start it with "
                "--set databuffer_address=HOST:PORT"
            )
        if job.n < 1:
            raise InvalidArgument(f"n = {job.n}: the samples per prompt must be >= 1")
        self.limits.check_batch(job.n, 0)
        self.limits.check_stop(job.sampling.stop_token_ids)
        job.sampling.validate()
        self._enter()
        try:
            with telemetry.tracer().start_as_current_span(
                "rollout.generate_batch",
                attributes={A.REPLICA: self.replica_id, A.JOB_ID: job.job_id, A.STEP: job.step},
            ) as span:
                start = time.perf_counter()
                batch, rows = self._read_rows(job)
                self.limits.check_batch(job.n, len(rows))
                prompts: Ragged = batch[S.PROMPT_IDS]
                if not isinstance(prompts, Ragged):
                    raise InvalidArgument(f"input column '{S.PROMPT_IDS}' must be ragged int32 token ids")
                requests = batch_requests(job, prompts, rows)
                for i, r in enumerate(requests):
                    try:
                        self.engine.validate(r)
                    except InvalidArgument as exc:
                        raise InvalidArgument(f"prompt row {rows[i // job.n]}: {exc.message}") from None
                results = self._run(requests, job.alive)
                out, samples = batch_output(batch, job, rows, results)
                self.databuffer.put(job.output, out, samples=samples, overwrite=True)
                stats = batch_stats(results, time.perf_counter() - start)
                span.set_attribute(A.REQUESTS, len(requests))
                span.set_attribute(A.TOKENS, stats.generated_tokens)
                telemetry.metrics().record_tokens(
                    stats.generated_tokens, stats.seconds, phase="generate", replica=self.replica_id
                )
                return stats
        finally:
            self._leave()

    def _read_rows(self, job: BatchJob) -> tuple[Batch, list[int]]:
        """Only this job's rows [row_begin, row_end) of its columns, and their row numbers in the whole batch."""
        begin, end = job.row_begin, job.row_end
        if begin < 0 or end < begin or (end == begin and begin != 0):
            raise InvalidArgument(
                f"rows [{job.row_begin}, {job.row_end}) are not a range of prompts; "
                "give 0 <= row_begin < row_end <= number of prompts (or both 0 for all)"
            )
        columns = list(dict.fromkeys([S.PROMPT_IDS, *job.columns])) if job.columns else []
        rows = None if begin == end == 0 else (begin, end)
        batch = self.databuffer.get(job.input, columns=columns, rows=rows, wait_seconds=self.buffer_wait_s)
        return batch, list(range(begin, begin + batch.num_rows()))

    def stream(self, request: GenerationRequest, prompt_text: str = "") -> Iterator[TokenChunk]:
        """Streams one response (interactive / multi-turn); `prompt_text` is tokenized when no ids are given."""
        self.limits.check_prompt_text(prompt_text)
        self.limits.check_stop(request.sampling.stop_token_ids)
        if not request.prompt_ids and prompt_text:
            request.prompt_ids = self.engine.tokenize(prompt_text)
        self.engine.validate(request)
        with self.streams.held():  # at most limits.max_streams at once, each on a server thread
            self._enter()
            try:
                yield from self.engine.stream(request)
            finally:
                self._leave()

    # --- weights ----------------------------------------------------------------------------------
    def _check_version(self, version: int) -> bool:
        """Refuses a version older than the served one; True when `version` is newer (or this replica is stale)."""
        current = self.engine.weight_version
        if version < current or version < 0:
            raise InvalidArgument(
                f"weight version {version} is older than the version {current} this replica serves; "
                "publish a newer version (versions only move forward)"
            )
        return version > current or self._state == STALE

    def _weights_changed(self, result: WeightUpdateResult, transport: str) -> WeightUpdateResult:
        if self._state == STALE:
            self._state = SERVING
        telemetry.metrics().set_weight_version(self.replica_id, result.version)
        telemetry.metrics().record_weight_update(result.seconds, transport=transport, replica=self.replica_id)
        return result

    def update_weights_from_disk(self, update: DiskUpdate) -> WeightUpdateResult:
        """Loads a complete version, or (`delta_base` set) a delta against that version, which a stale
        replica or one serving another version refuses with BaseMismatch (the scheduler refits it)."""
        version, delta_base = update.version, update.delta_base
        if not update.path:
            raise InvalidArgument("weights.path is empty: give the folder of the published version")
        if not self._check_version(version):
            return WeightUpdateResult(version, 0.0, 0)
        if delta_base is None:
            try:
                result = self.engine.update_weights_from_disk(update)
            except TornWeights:
                self._state = STALE  # part of the weights may be new: serve nothing until refitted
                raise
            return self._weights_changed(result, "disk")
        if self._state == STALE or self.engine.weight_version != delta_base:
            raise BaseMismatch(
                f"weight version {version} is a delta against version {delta_base}, but this replica "
                f"serves {self.engine.weight_version}{' (stale)' if self._state == STALE else ''}; "
                "refit it with a complete version"
            )
        return self._weights_changed(self.engine.update_weights_from_delta(update), "disk")

    def init_weight_update_group(self, group: GroupSpec) -> int:
        return self.engine.init_weight_update_group(group)

    def update_weights_from_distributed(self, update: GroupUpdate) -> WeightUpdateResult:
        self._check_version(update.version)  # the same version received again: the trainer is already sending it
        try:
            result = self.engine.update_weights_from_distributed(update)
        except (InvalidArgument, NotFound):
            raise  # refused before any tensor changed (a bad version, an unknown group): the replica is as it was
        except MeshrlError:
            self._state = STALE  # part of the weights may be new: serve nothing until refitted
            raise
        return self._weights_changed(result, "distributed")

    def destroy_weight_update_group(self, group_name: str) -> None:
        self.engine.destroy_weight_update_group(group_name)

    def weight_checksums(self, names: Sequence[str]) -> tuple[int, dict[str, str]]:
        return self.engine.weight_checksums(names)

    # --- control ------------------------------------------------------------------------------------
    def pause(self, mode: PauseMode) -> int:
        self._user_paused = True
        return self.engine.pause(mode)

    def continue_generation(self) -> None:
        self.engine.continue_generation()
        self._user_paused = False

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def status(self) -> ReplicaStatus:
        s = self.engine.status()
        return ReplicaStatus(
            replica_id=self.replica_id,
            engine=s.engine,
            model_path=s.model_path,
            weight_version=s.weight_version,
            state=self.state,
            queue_depth=s.queue_depth,
            running_requests=s.running_requests,
            tokens_per_second=s.tokens_per_second,
            capacity=self.capacity,
            generated_tokens=s.generated_tokens,
            device=self.engine.device,
            weight_ranks=self.engine.weight_ranks,
        )
