"""The client-side router over rollout replicas, used by the scheduler (and tests, benchmarks).

It follows the replica registry (or a fixed address list), spreads work by least outstanding
work per unit of capacity, keeps every sample of a prompt group (a batch's prompt range) and every
turn of a session on one replica, retries work of a replica that died on another one, and drains
a replica before it is removed. A prompt batch is split into prompt ranges; each replica writes
its range to an output shard, and the shards are concatenated into the output key at the end.
"""

from __future__ import annotations

import collections
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from meshrl.api.common.v1 import keys_pb2
from meshrl.api.rollout.v1 import rollout_pb2 as pb
from meshrl.api.rollout.v1 import rollout_pb2_grpc
from meshrl.common.codec import concat_batches
from meshrl.common.errors import DeadlineExceeded, InvalidArgument, Unavailable, from_rpc_error
from meshrl.common.grpc_channel import ChannelConfig, open_channel
from meshrl.common.registry import DRAINING, SERVING, ReplicaInfo, ReplicaRegistry
from meshrl.scheduler.fleet.router_stream import StreamingMixin
from meshrl.scheduler.fleet.router_types import (
    RETRYABLE,
    BatchResult,
    Replica,
    StaleFleet,
    _Chunk,
    plan_chunks,
    sampling_params,
    summarize,
)

log = logging.getLogger(__name__)


class RolloutRouter(StreamingMixin):
    def __init__(
        self,
        *,
        registry: ReplicaRegistry | None = None,
        addresses: Sequence[str] = (),
        databuffer: Any = None,
        channel_config: ChannelConfig | None = None,
        rpc_timeout_s: float = 600.0,
        max_attempts: int = 5,
        quarantine_s: float = 5.0,
        watch_interval_s: float = 0.5,
        default_capacity: int = 64,
        max_sessions: int = 100_000,
        allow_empty: bool = False,
    ) -> None:
        if registry is None and not addresses and not allow_empty:
            raise InvalidArgument("a rollout router needs a replica registry or at least one replica address")
        self.registry = registry
        self.databuffer = databuffer  # meshrl.common.databuffer_client.DataBufferClient
        self.channel_config = channel_config or ChannelConfig(retry_max_attempts=1)
        self.rpc_timeout_s = rpc_timeout_s
        self.max_attempts = max_attempts
        self.quarantine_s = quarantine_s
        self.default_capacity = default_capacity
        self._replicas: dict[str, Replica] = {}
        self._sessions: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._max_sessions = max_sessions
        self._lock = threading.Condition()
        self._watcher = None
        self._none_left: str | None = None  # why no replica can ever take work (`none_left`), until one is added
        # samples made with weights older than this are refused (the fleet sets it after each publication)
        self.min_version = 0
        self.on_behind: Callable[[str], None] | None = None  # told the address of a replica found behind
        if addresses:
            self._sync(
                [ReplicaInfo(replica_id=a, address=a, capacity=default_capacity, state=SERVING) for a in addresses]
            )
        if registry is not None:
            self._sync(registry.list())
            self._watcher = registry.watch(self._sync, interval=watch_interval_s)

    # --- membership -------------------------------------------------------------------------------
    def set_addresses(self, addresses: Sequence[str]) -> None:
        """Without a registry: the fleet is exactly these addresses from now on (a removed one gets no new work)."""
        infos = [ReplicaInfo(replica_id=a, address=a, capacity=self.default_capacity, state=SERVING) for a in addresses]
        self._sync(infos, complete=True)

    def none_left(self, reason: str) -> None:
        """No replica will come back (the fleet's last one exited, and nothing registers replicas): work waiting
        for a replica fails now with `reason` instead of at its deadline. Adding a replica undoes it."""
        with self._lock:
            self._none_left = reason
            self._lock.notify_all()

    def _raise_if_none_left(self) -> None:
        """(under the lock) Unavailable when no replica is listed and none will come (`none_left`)."""
        if self._none_left is not None and not self._replicas:
            raise Unavailable(f"no rollout replica can take the work: {self._none_left}")

    def _sync(self, infos: list[ReplicaInfo], complete: bool = False) -> None:
        """Adopts a full listing: new replicas get a channel, gone ones are closed (their work retried)."""
        with self._lock:
            seen = set()
            for info in infos:
                seen.add(info.replica_id)
                r = self._replicas.get(info.replica_id)
                if r is None or r.address != info.address:
                    self._none_left = None
                    if r is not None and r.channel is not None:
                        r.channel.close()
                    channel = open_channel(info.address, self.channel_config)
                    r = Replica(info.replica_id, info.address, channel=channel)
                    r.stub = rollout_pb2_grpc.RolloutStub(channel)
                    self._replicas[info.replica_id] = r
                r.capacity = max(1, info.capacity)
                r.weight_version = info.weight_version
                if r.state != DRAINING or info.state == DRAINING:
                    r.state = info.state
                if r.failed_at and info.updated_at and info.updated_at > time.time() - 1.0 and info.state == SERVING:
                    r.failed_at = 0.0  # it heartbeats again
            if self.registry is not None or complete:
                for rid in [rid for rid in self._replicas if rid not in seen]:
                    gone = self._replicas.pop(rid)
                    if gone.calls == 0 and gone.channel is not None:
                        gone.channel.close()
            self._lock.notify_all()

    def replicas(self) -> list[Replica]:
        with self._lock:
            return sorted(self._replicas.values(), key=lambda r: r.replica_id)

    def serving(self) -> list[Replica]:
        now = time.monotonic()
        return [
            r
            for r in self.replicas()
            if r.state == SERVING and not (r.failed_at and now - r.failed_at < self.quarantine_s)
        ]

    def wait_for_replicas(self, count: int, timeout: float) -> list[Replica]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.serving()) < count:
                left = deadline - time.monotonic()
                self._raise_if_none_left()
                if left <= 0:
                    raise DeadlineExceeded(f"fewer than {count} rollout replicas serve after {timeout:.0f}s")
                self._lock.wait(min(left, 0.5))
        return self.serving()

    def _pick(
        self, work: int, *, session: str = "", exclude: set[str] = frozenset(), deadline: float, need_room: bool = False
    ) -> Replica:
        """The serving replica with the least outstanding work per capacity (the session's replica if alive)."""
        with self._lock:
            while True:
                now = time.monotonic()
                healthy = [
                    r
                    for r in self._replicas.values()
                    if r.state == SERVING and not (r.failed_at and now - r.failed_at < self.quarantine_s)
                ]
                # Work that failed on a replica goes elsewhere; back to it only when no other one serves.
                live = [r for r in healthy if r.replica_id not in exclude] or healthy
                if session and session in self._sessions:
                    sticky = next((r for r in live if r.replica_id == self._sessions[session]), None)
                    if sticky is not None:
                        self._sessions.move_to_end(session)
                        return self._charge(sticky, work)
                if need_room:
                    live = [r for r in live if r.outstanding == 0 or r.outstanding + work <= r.capacity]
                if live:
                    best = min(live, key=lambda r: (r.load(work), r.calls, r.replica_id))
                    if session:
                        self._sessions[session] = best.replica_id
                        if len(self._sessions) > self._max_sessions:
                            self._sessions.popitem(last=False)
                    return self._charge(best, work)
                left = deadline - now
                self._raise_if_none_left()
                if left <= 0:
                    names = ", ".join(f"{r.replica_id}={r.state}" for r in self._replicas.values()) or "none registered"
                    raise Unavailable(f"no rollout replica can take the work ({names}); start or refit replicas")
                self._lock.wait(min(left, 0.25))

    def _charge(self, r: Replica, work: int) -> Replica:
        r.outstanding += work
        r.calls += 1
        return r

    def _release(self, r: Replica, work: int, failed: bool) -> None:
        with self._lock:
            r.outstanding -= work
            r.calls -= 1
            if failed:
                r.failed_at = time.monotonic()
                for s in [s for s, rid in self._sessions.items() if rid == r.replica_id]:
                    del self._sessions[s]
            self._lock.notify_all()

    # --- prompt batches -----------------------------------------------------------------------------
    def generate_batch(
        self,
        input_key: keys_pb2.BatchKey,
        output_key: keys_pb2.BatchKey,
        sampling: pb.SamplingParams | Mapping[str, Any],
        *,
        n: int = 1,
        job_id: str = "",
        step: int = 0,
        num_prompts: int | None = None,
        chunk_prompts: int | None = None,
        merge: bool = True,
        timeout: float | None = None,
        columns: Sequence[str] = (),
    ) -> BatchResult:
        """Generates n samples for every prompt of `input_key` across the replicas; returns where they are.
        `num_prompts`: the input's row count (the scheduler's data_load reports it; when None the router
        reads the batch to count it); `columns`: the input columns each replica reads (rows of its range
        only) and copies into its samples; empty: every column."""
        params = sampling_params(sampling)
        if n < 1:
            raise InvalidArgument(f"n = {n}: the samples per prompt must be >= 1")
        if num_prompts is None:
            if self.databuffer is None:
                raise InvalidArgument("give num_prompts, or a data-buffer client so the router can count the prompts")
            num_prompts = self.databuffer.get(input_key).num_rows()
        if num_prompts <= 0:
            raise InvalidArgument(f"the input batch has {num_prompts} prompts; nothing to generate")
        start = time.perf_counter()
        deadline = time.monotonic() + (timeout or self.rpc_timeout_s)
        live = self.serving() or self.wait_for_replicas(1, max(0.0, deadline - time.monotonic()))
        chunks = plan_chunks(num_prompts, n, chunk_prompts, [r.capacity for r in live])
        single = len(chunks) == 1
        result = BatchResult(keys=[])
        replies: dict[int, pb.GenerateBatchResponse] = {}
        base = pb.GenerateBatchRequest(input=input_key, sampling=params, n=n, job_id=job_id, step=step, columns=columns)

        def run(c: _Chunk) -> None:
            replies[c.index] = self._run_range(c, base, c.shard_key(output_key, single), deadline, result)

        if single:  # one range: its RPC in this thread (a pool thread would cost two hand-offs per call)
            run(chunks[0])
        else:
            with ThreadPoolExecutor(max_workers=min(len(chunks), 64), thread_name_prefix="router") as pool:
                # each chunk's RPC runs inside the caller's trace context (pool threads do not inherit it)
                for future in [pool.submit(contextvars.copy_context().run, run, c) for c in chunks]:
                    future.result()
        summarize(result, [replies[c.index] for c in chunks])
        shards = [c.shard_key(output_key, single) for c in chunks]
        result.keys = shards if single or not merge else [self._merge(shards, output_key)]
        result.seconds = time.perf_counter() - start
        return result

    def _run_range(
        self, c: _Chunk, base: pb.GenerateBatchRequest, output: keys_pb2.BatchKey, deadline: float, result: BatchResult
    ) -> pb.GenerateBatchResponse:
        """Rows [c.begin, c.end) on the least loaded replica; after a retryable failure, on another one."""
        work = (c.end - c.begin) * base.n
        while True:
            replica = self._pick(work, exclude=c.excluded, deadline=deadline, need_room=True)
            req = pb.GenerateBatchRequest()
            req.CopyFrom(base)
            req.output.CopyFrom(output)
            req.row_begin, req.row_end = c.begin, c.end
            c.attempts += 1
            try:
                left = max(1.0, deadline - time.monotonic())
                reply = replica.stub.GenerateBatch(req, timeout=left, wait_for_ready=False)
            except grpc.RpcError as exc:
                retry = exc.code() in RETRYABLE
                self._release(replica, work, failed=retry)
                if not retry or c.attempts >= self.max_attempts or time.monotonic() >= deadline:
                    raise from_rpc_error(exc) from None
                log.warning(
                    "rows [%d, %d) failed on %s (%s): retrying elsewhere",
                    c.begin,
                    c.end,
                    replica.replica_id,
                    exc.code().name,
                )
                c.excluded.add(replica.replica_id)
                with self._lock:
                    result.retries += 1
                continue
            if reply.samples and reply.min_weight_version < self.min_version:
                self._behind(replica, work, reply.min_weight_version)  # its shard is rewritten by the retry
                c.excluded.add(replica.replica_id)
                with self._lock:
                    result.retries += 1
                continue
            self._release(replica, work, failed=False)
            with self._lock:
                counted = result.samples_by_replica
                counted[replica.replica_id] = counted.get(replica.replica_id, 0) + reply.samples
            return reply

    def _behind(self, replica: Replica, work: int, version: int, release: bool = True) -> None:
        """A replica answered with weights older than the job's (restarted, or it missed an update unnoticed):
        it leaves the routing through `on_behind` and the work goes to another replica, or the call fails now."""
        if release:
            self._release(replica, work, failed=True)
        if self.on_behind is not None:
            self.on_behind(replica.address)
        log.warning(
            "%s generated with weight version %d, the job is at %d: stale",
            replica.replica_id,
            version,
            self.min_version,
        )
        if not [r for r in self.serving() if r.replica_id != replica.replica_id]:
            raise StaleFleet(
                f"rollout replica {replica.replica_id} generated with weight version {version} but the job is at "
                f"version {self.min_version} (restarted without a refit?), and no other replica serves; "
                "it is refitted before it serves again"
            )

    def _merge(self, shards: list[keys_pb2.BatchKey], output_key: keys_pb2.BatchKey) -> keys_pb2.BatchKey:
        if self.databuffer is None:
            raise InvalidArgument("merging output shards needs a data-buffer client (or pass merge=False)")
        with ThreadPoolExecutor(max_workers=min(len(shards), 8)) as pool:
            batches = list(pool.map(lambda k: self.databuffer.get(k), shards))
        self.databuffer.put(output_key, concat_batches(batches), overwrite=True)
        for key in shards:
            self.databuffer.delete(key)
        return output_key

    # --- scale down ---------------------------------------------------------------------------------
    def drain(self, replica_id: str, timeout: float = 60.0) -> bool:
        """Stops routing to a replica and waits until it has no work in flight (from any router).

        Returns True when it is idle (then it may be stopped), False when `timeout` passed first.
        """
        if self.registry is not None:
            self.registry.request_drain(replica_id)
        deadline = time.monotonic() + timeout
        with self._lock:
            r = self._replicas.get(replica_id)
            if r is None:
                return True
            r.state = DRAINING
            for s in [s for s, rid in self._sessions.items() if rid == replica_id]:
                del self._sessions[s]
            while r.calls:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.25))
        while time.monotonic() < deadline:
            try:
                status = r.stub.GetStatus(pb.GetStatusRequest(), timeout=5, wait_for_ready=False)
            except grpc.RpcError:
                return True  # already gone
            if status.running_requests == 0 and status.queue_depth == 0:
                return True
            time.sleep(0.1)
        return False

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
        with self._lock:
            for r in self._replicas.values():
                if r.channel is not None:
                    r.channel.close()
            self._replicas.clear()
