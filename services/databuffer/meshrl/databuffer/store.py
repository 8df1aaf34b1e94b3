"""The data buffer's core: keyed batches, sample streams, budget and stats over one Redis,
with no gRPC in sight (the servicer converts protos and calls this; tests call it in-process).

It holds no state of its own beyond caches, so any number of instances can serve one Redis.
Every public method turns Redis failures into typed errors (UNAVAILABLE, RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from meshrl.api.common.v1 import tensor_pb2
from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.codec import Batch, decode_batch, encode_batch
from meshrl.common.databuffer_client import StreamStats
from meshrl.common.errors import InvalidArgument
from meshrl.databuffer.batches import BatchStore, PutResult, StoredBatch
from meshrl.databuffer.config import DataBufferConfig
from meshrl.databuffer.connection import RedisHandle, open_redis, redis_errors
from meshrl.databuffer.direct import DirectLayout, DirectPath
from meshrl.databuffer.indexes import Indexes
from meshrl.databuffer.keys import BatchRef, KeySpace, check_name
from meshrl.databuffer.ledger import Ledger
from meshrl.databuffer.notify import CommitNotifier
from meshrl.databuffer.reads import BatchReader, Located
from meshrl.databuffer.streams import ReadResult, StreamStore

log = logging.getLogger(__name__)


@dataclass
class Stats:
    batches: int = 0
    bytes: int = 0
    streams: list[StreamStats] = field(default_factory=list)
    drops_by_reason: dict[str, int] = field(default_factory=dict)
    budget_bytes: int = 0
    budget_entries: int = 0
    used_bytes: int = 0  # everything the budget counts (all jobs, staged puts included)
    used_entries: int = 0
    get_calls: int = 0  # GetBatch calls served by this process since it started, and what they sent, plus the
    # zero-RPC gets of every client (counted in Redis under the key prefix: meshrl.databuffer.zero_rpc_scripts)
    get_bytes: int = 0
    get_rows: int = 0


class DataBuffer:
    """One service instance's view of the buffer. `DataBuffer.open(cfg)` connects (or starts Redis)."""

    def __init__(self, cfg: DataBufferConfig, handle: RedisHandle) -> None:
        self.cfg = cfg
        self.handle = handle
        client = handle.client
        self.keys = KeySpace(cfg.redis.key_prefix)
        self.ledger = Ledger(client, self.keys.ledger(), cfg.budget.max_bytes, cfg.budget.max_entries)
        self.indexes = Indexes(client, self.keys)
        self.notifier = CommitNotifier(client, self.keys.commit_channel())
        self._io = ThreadPoolExecutor(max_workers=16, thread_name_prefix="databuffer-io")
        reader = BatchReader(client, self.keys, self.notifier, cfg.limits, cfg.batches, self._io)
        self.batches = BatchStore(reader, self.indexes, self.ledger)
        self.direct = DirectPath(self.batches)
        self.streams = StreamStore(client, self.keys, self.indexes, self.ledger, cfg.limits, cfg.streams)

    @classmethod
    def open(cls, cfg: DataBufferConfig) -> DataBuffer:
        return cls(cfg, open_redis(cfg.redis, cfg.budget.max_bytes))

    def close(self) -> None:
        """Stops background threads, closes Redis connections and stops an embedded Redis."""
        self.notifier.close()
        self._io.shutdown(wait=True, cancel_futures=True)
        self.handle.close()

    # --- keyed batches -------------------------------------------------------------------
    def put_batch(
        self, ref: BatchRef, header: tensor_pb2.BatchHeader, frames: Iterable[Any], **options: Any
    ) -> PutResult:
        """`BatchStore.put` (options: ttl_seconds, overwrite) with Redis errors typed."""
        with redis_errors(f"put of batch {ref}"):
            return self.batches.put(ref, header, frames, **options)

    def open_batch(self, ref: BatchRef, *, wait_seconds: float = 0.0, **selection: Any) -> StoredBatch:
        """The batch's header now, its chunks as they are read (errors typed there too). `selection`:
        columns, rows, missing_ok of `BatchStore.open`."""
        with redis_errors(f"get of batch {ref}"):
            stored = self.batches.open(ref, wait_seconds=wait_seconds, **selection)
        if stored.chunks is not None:
            stored.chunks = self._typed(stored.chunks, f"get of batch {ref}")
        return stored

    @staticmethod
    def _typed(chunks: Iterator[bytes], what: str) -> Iterator[bytes]:
        with redis_errors(what):
            yield from chunks

    def put_columns(
        self,
        ref: BatchRef,
        columns: Mapping[str, Any],
        samples: Sequence[tensor_pb2.SampleMeta] = (),
        attrs: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> PutResult:
        """In-process convenience: encodes columns (codec) and puts them in frames of the frame limit."""
        header, views = encode_batch(columns, samples, attrs)
        step = self.cfg.limits.max_frame_bytes
        frames = (v[i : i + step] for v in views for i in range(0, v.nbytes, step))
        return self.put_batch(ref, header, frames, **kwargs)

    def get_batch(self, ref: BatchRef, *, wait_seconds: float = 0.0, **selection: Any) -> Batch:
        """In-process convenience: the batch (or its selected columns and rows) decoded."""
        stored = self.open_batch(ref, wait_seconds=wait_seconds, **selection)
        return decode_batch(stored.header, b"".join(stored.chunks))

    # --- the direct data path (meshrl.databuffer.direct): clients move the payload themselves ---------------
    def direct_layout(self) -> DirectLayout:
        with redis_errors("describe of the direct path"):
            return self.direct.layout()

    def redis_hint(self) -> str:
        """host:port (or socket path) of the Redis this service uses, without credentials."""
        kwargs = getattr(getattr(self.handle.client, "connection_pool", None), "connection_kwargs", {})
        if "path" in kwargs:
            return str(kwargs["path"])
        return f"{kwargs['host']}:{kwargs['port']}" if "host" in kwargs else ""

    def commit_direct_put(
        self, ref: BatchRef, header: tensor_pb2.BatchHeader, generation: str, chunks: int, **options: Any
    ) -> PutResult:
        """`DirectPath.commit` (options: ttl_seconds, overwrite) with Redis errors typed."""
        with redis_errors(f"direct put of batch {ref}"):
            return self.direct.commit(ref, header, generation, chunks, **options)

    def locate_batch(self, ref: BatchRef, **options: Any) -> Located:
        """`DirectPath.locate` (options: wait_seconds, columns, rows, missing_ok, inline_below) with Redis errors
        typed."""
        with redis_errors(f"locate of batch {ref}"):
            return self.direct.locate(ref, **options)

    def delete_batch(self, ref: BatchRef) -> bool:
        with redis_errors(f"delete of batch {ref}"):
            return self.batches.delete(ref)

    def delete_step(self, job_id: str, step: int) -> tuple[int, int]:
        """Deletes every batch of one step of a job; returns how many existed and the job's bytes (stats)
        just before."""
        if step < 0:
            raise InvalidArgument(f"step = {step} must be >= 0", field="step")
        held = self.stats(job_id).bytes
        with redis_errors(f"delete of step {step} of job '{job_id}'"):
            return self.batches.delete_many(self.batches.list(job_id, step)), held

    def list_batches(self, job_id: str, step: int = -1) -> list[BatchRef]:
        with redis_errors(f"list of job '{job_id}'"):
            return self.batches.list(job_id, step)

    def delete_job(self, job_id: str) -> tuple[int, int]:
        """Deletes every batch and stream of a job; returns (batches, streams) deleted."""
        check_name(job_id, "job_id")
        with redis_errors(f"delete of job '{job_id}'"):
            batches = self.batches.delete_job(job_id)
            streams = self.streams.delete_job(job_id)
            self.indexes.remove_job(job_id)
        return batches, streams

    # --- sample streams --------------------------------------------------------------------
    def append_groups(self, job_id: str, stream: str, groups: Sequence[pb.SampleGroup]) -> list[str]:
        with redis_errors(f"append to stream '{stream}'"):
            return self.streams.append(job_id, stream, groups)

    def read_groups(self, job_id: str, stream: str, consumer_group: str, consumer: str, **options: Any) -> ReadResult:
        """`read` of a ReadGroupsRequest made of these fields and `options` (max_groups, block_seconds, ...)."""
        request = pb.ReadGroupsRequest(job_id=job_id, stream=stream, consumer_group=consumer_group, consumer=consumer)
        for name, value in options.items():
            setattr(request, name, value)
        return self.read(request)

    def read(self, request: pb.ReadGroupsRequest) -> ReadResult:
        with redis_errors(f"read of stream '{request.stream}'"):
            return self.streams.read(request)

    def ack_groups(self, job_id: str, stream: str, consumer_group: str, entry_ids: Sequence[str]) -> int:
        with redis_errors(f"ack on stream '{stream}'"):
            return self.streams.ack(job_id, stream, consumer_group, entry_ids)

    # --- stats -------------------------------------------------------------------------------
    def stats(self, job_id: str = "") -> Stats:
        """Batches, bytes, per-stream lag and drops of one job ("" = every job), and the budget."""
        if job_id:
            check_name(job_id, "job_id")
        with redis_errors("stats"):
            out = Stats(budget_bytes=self.cfg.budget.max_bytes, budget_entries=self.cfg.budget.max_entries)
            for job in [job_id] if job_id else self.indexes.jobs():
                count, size = self.batches.usage(job)
                streams, drops, _groups, held = self.streams.stats(job)
                out.batches += count
                out.bytes += size + held
                out.streams += streams
                for reason, n in drops.items():
                    out.drops_by_reason[reason] = out.drops_by_reason.get(reason, 0) + n
            reads = self.batches.reads
            zero = [int(n or 0) for n in self.handle.client.hmget(self.keys.read_stats(), "calls", "bytes", "rows")]
            out.get_calls, out.get_bytes, out.get_rows = (
                reads.calls + zero[0],
                reads.bytes + zero[1],
                reads.rows + zero[2],
            )
            usage = self.ledger.usage()
            out.used_bytes, out.used_entries = usage.bytes, usage.entries
        return out
