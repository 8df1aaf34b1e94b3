"""Client of the data buffer service, used by every service and DAG node that writes or reads
batches (keyed by job, step, node[, shard]) or sample streams.

Batches travel as a header message plus raw payload frames. Frames are written straight in
protobuf's wire format (`payload` = field 2, length-delimited, the same bytes the generated
code would produce: meshrl.common.databuffer_wire) so that neither side copies the bytes through message objects; the
service (meshrl.databuffer.server) uses the same helpers. Failed calls raise the typed
errors of meshrl.common.errors (InvalidArgument, NotFound, ResourceExhausted, ...).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np

from meshrl.api.common.v1 import keys_pb2, tensor_pb2
from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.api.databuffer.v1 import databuffer_pb2_grpc as pb_grpc
from meshrl.common.buffer_frames import split_frames
from meshrl.common.codec import Batch, batch_from_proto, decode_batch, encode_batch
from meshrl.common.databuffer_inputs import combine_inputs, refuse_repeated
from meshrl.common.databuffer_types import (  # noqa: F401  (re-exported: callers import them from here)
    BufferStats,
    DeliveredGroup,
    Group,
    JobDeletion,
    ReadResult,
    StepDeletion,
    StreamStats,
)
from meshrl.common.databuffer_wire import (  # noqa: F401  (re-exported: tests import them from here)
    deserialize_get_response,
    deserialize_small_get,
    encode_small_put,
    serialize_put_request,
)
from meshrl.common.direct_path import TRANSIENT, DirectPath, DirectPathConfig, connect
from meshrl.common.errors import DataLoss, Internal, InvalidArgument, NotFound, Unavailable, from_rpc_error
from meshrl.common.grpc_channel import ChannelConfig, call, open_channel, wait_until_serving

log = logging.getLogger(__name__)

SERVICE = "meshrl.databuffer.v1.DataBuffer"
MiB = 1 << 20
DEFAULT_FRAME_BYTES = 4 * MiB
APPEND_REQUEST_BYTES = 8 * MiB  # append_groups splits larger lists into several requests


class DataBufferClient:
    """A channel to one data buffer service; thread-safe. `frame_bytes`: the gRPC payload frame size (the
    buffer's `limits.chunk_bytes` is its Redis value size). `direct`: move payloads to and from the service's
    Redis directly (meshrl.common.direct_path); None: through the service."""

    def __init__(
        self,
        address: str,
        channel_config: ChannelConfig | None = None,
        frame_bytes: int = DEFAULT_FRAME_BYTES,
        direct: DirectPathConfig | None = None,
    ) -> None:
        if frame_bytes < 4096:
            raise InvalidArgument(f"frame_bytes = {frame_bytes} is too small; use at least 4096 (default 4 MiB)")
        self.address = address
        self.frame_bytes = frame_bytes
        self.direct_config = direct
        self._direct: DirectPath | None = None
        self._direct_lock = threading.Lock()
        self._channel = open_channel(address, channel_config)
        self._stub = pb_grpc.DataBufferStub(self._channel)
        self._put = self._channel.stream_unary(
            f"/{SERVICE}/PutBatch",
            request_serializer=serialize_put_request,
            response_deserializer=pb.PutBatchResponse.FromString,
        )
        self._put_small = self._channel.unary_unary(
            f"/{SERVICE}/PutSmallBatch",
            request_serializer=bytes,  # already in wire format (encode_small_put)
            response_deserializer=pb.PutBatchResponse.FromString,
        )
        self._get_small = self._channel.unary_unary(
            f"/{SERVICE}/GetSmallBatch",
            request_serializer=pb.GetBatchRequest.SerializeToString,
            response_deserializer=deserialize_small_get,
        )
        self._get = self._channel.unary_stream(
            f"/{SERVICE}/GetBatch",
            request_serializer=pb.GetBatchRequest.SerializeToString,
            response_deserializer=deserialize_get_response,
        )

    def direct_path(self) -> DirectPath | None:
        """The direct data path, set up on first use (the service's layout, a checked Redis connection); None
        when not configured, or when it cannot be set up and `fallback` is on (said once in the log)."""
        cfg = self.direct_config
        if cfg is None or self._direct is not None:
            return self._direct
        with self._direct_lock:
            if self._direct is None and self.direct_config is not None:
                try:
                    describe = lambda: call(self._stub.DescribeDirectPath, pb.DescribeDirectPathRequest(), timeout=30)  # noqa: E731
                    self._direct = DirectPath(connect(cfg), describe(), describe)
                except (Unavailable, Internal) as exc:  # Internal: a service without the path (UNIMPLEMENTED)
                    if not cfg.fallback:
                        raise
                    log.warning("the data buffer's direct path is off, batches go through the service: %s", exc)
                    self.direct_config = None
        return self._direct

    def _direct_min_bytes(self) -> int:
        return self.direct_config.min_bytes if self.direct_config is not None else 0

    def _relay_instead(self, exc: Exception) -> None:
        """Redis failed under the direct path: relay from now on when `fallback` allows, else raise Unavailable."""
        if self.direct_config is None or not self.direct_config.fallback:
            raise Unavailable(f"the data buffer's Redis failed under the direct path: {exc}") from exc
        log.warning("the data buffer's Redis failed under the direct path (%s); batches go through the service", exc)
        if self._direct is not None:
            self._direct.close()
        self.direct_config, self._direct = None, None

    def wait_until_ready(self, timeout: float = 30.0) -> None:
        wait_until_serving(self._channel, timeout=timeout, service=SERVICE)

    # --- keyed batches --------------------------------------------------------------------
    def put(
        self,
        key: keys_pb2.BatchKey,
        columns: Batch | Mapping[str, Any],
        *,
        samples: Sequence[tensor_pb2.SampleMeta] = (),
        attrs: Mapping[str, str] | None = None,
        ttl_seconds: int = 0,
        overwrite: bool = True,
        timeout: float = 60.0,
    ) -> int:
        """Stores a batch (numpy / torch columns or a Batch) under `key`, atomically; returns its bytes."""
        if isinstance(columns, Batch):
            samples = samples or columns.samples
            attrs = {**columns.attrs, **(attrs or {})}
            columns = columns.columns
        header, views = encode_batch(columns, samples, attrs)
        start = pb.PutBatchStart(key=key, header=header, ttl_seconds=ttl_seconds, overwrite=overwrite)
        direct = self.direct_path() if header.total_bytes >= self._direct_min_bytes() else None
        if direct is not None:
            try:
                if (written := direct.put_whole(key, header, views, ttl_seconds=ttl_seconds, overwrite=overwrite)) >= 0:
                    return written
                gen, count = direct.stage(key, views)
            except TRANSIENT as exc:
                self._relay_instead(exc)
            else:
                request = pb.CommitDirectPutRequest(start=start, generation=gen, chunks=count)
                return call(self._stub.CommitDirectPut, request, timeout=timeout).bytes_written
        if header.total_bytes <= self.frame_bytes:  # one frame: one unary message, no stream
            return call(self._put_small, encode_small_put(start, views), timeout=timeout).bytes_written

        def requests() -> Iterator[Any]:
            yield pb.PutBatchRequest(start=start)
            yield from split_frames(views, self.frame_bytes)

        return call(self._put, requests(), timeout=timeout).bytes_written

    def get(
        self,
        key: keys_pb2.BatchKey,
        *,
        columns: Sequence[str] = (),
        rows: tuple[int, int] | None = None,
        missing_ok: bool = False,
        wait_seconds: float = 0.0,
        timeout: float = 60.0,
    ) -> Batch:
        """The batch under `key`; waits up to `wait_seconds` for it to appear (then NotFound).

        Only `columns` (empty: all; a name the batch lacks is NotFound unless `missing_ok`) of rows
        [begin, end) (None: all; outside the batch is InvalidArgument) travel. `timeout` bounds the
        transfer; the call's deadline is wait_seconds + timeout. The arrays are writable views of one
        buffer holding the payload.
        """
        request = pb.GetBatchRequest(key=key, wait_seconds=wait_seconds, columns=columns, missing_ok=missing_ok)
        if rows is not None:
            request.rows.begin, request.rows.end = rows
        direct = self.direct_path()
        if direct is not None:
            try:  # a whole batch with no RPC; a selection, or one not there yet (waiting), located by the service
                if not columns and rows is None and (whole := direct.get_whole(key)) is not None:
                    return decode_batch(*whole)
                request.inline_below = self._direct_min_bytes()
                located = call(self._stub.LocateBatch, request, timeout=wait_seconds + timeout)
                if located.inline:  # small: it came with the answer
                    return decode_batch(located.header, bytearray(located.payload))
                return decode_batch(located.header, direct.read(located))
            except TRANSIENT as exc:
                self._relay_instead(exc)
        small = call(self._get_small, request, timeout=wait_seconds + timeout)  # one unary call when it fits
        if isinstance(small, tuple):
            header, view = small
            return decode_batch(header, bytearray(view))  # one copy: writable arrays, as below
        if not small.too_large:  # the reply in protobuf's own layout
            return decode_batch(small.header, bytearray(small.payload))
        replies = self._get(request, timeout=timeout)
        try:
            first = next(replies, None)
            if not isinstance(first, pb.GetBatchResponse) or first.WhichOneof("body") != "header":
                raise DataLoss(f"GetBatch of {key.job_id}/{key.step}/{key.node_id} did not start with a header")
            header = first.header
            buf = np.empty(header.total_bytes, dtype=np.uint8)
            pos = 0
            for reply in replies:
                data = reply if isinstance(reply, memoryview) else memoryview(reply.payload)
                if pos + data.nbytes > header.total_bytes:
                    raise DataLoss(f"GetBatch sent more than the {header.total_bytes} bytes its header announced")
                buf[pos : pos + data.nbytes] = np.frombuffer(data, dtype=np.uint8)
                pos += data.nbytes
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        except BaseException:
            replies.cancel()
            raise
        if pos != header.total_bytes:
            raise DataLoss(f"GetBatch ended after {pos} of the {header.total_bytes} bytes its header announced")
        return decode_batch(header, buf)

    def get_many(
        self,
        keys: Sequence[keys_pb2.BatchKey],
        *,
        columns: Sequence[str] = (),
        wait_seconds: float = 0.0,
        timeout: float = 60.0,
    ) -> Batch:
        """The batches of several upstream nodes (same rows), merged by column. The shards of one
        node's output (same job, step and node) are first concatenated row-wise in shard order.
        With `columns`, each batch sends only those it holds, and a column none holds is NotFound.
        The small ones come in one GetSmallBatches call; the others are read in parallel."""
        if not keys:
            if columns:
                raise NotFound(f"columns {list(columns)} were asked for, but no input batch was given")
            return Batch()
        refuse_repeated(keys)
        opts = {"columns": columns, "missing_ok": bool(columns), "wait_seconds": wait_seconds, "timeout": timeout}
        batches: list[Batch | None] = [None] * len(keys)
        if len(keys) > 1:  # one call for the small ones (within one frame, or direct.min_bytes)
            limit = self._direct_min_bytes() if self.direct_path() is not None else self.frame_bytes
            gets = [
                pb.GetBatchRequest(key=k, wait_seconds=wait_seconds, columns=columns, missing_ok=bool(columns))
                for k in keys
            ]
            request = pb.GetSmallBatchesRequest(gets=gets, limit_bytes=limit)
            reply = call(self._stub.GetSmallBatches, request, timeout=wait_seconds * len(keys) + timeout)
            for i, one in enumerate(reply.batches):
                if not one.too_large:
                    batches[i] = decode_batch(one.header, bytearray(one.payload))
        rest = [i for i, b in enumerate(batches) if b is None]
        if len(rest) == 1:  # one read: in this thread, no hand-off to a pool thread and back
            batches[rest[0]] = self.get(keys[rest[0]], **opts)
        elif rest:  # each read runs in a copy of the caller's context, so its span joins the caller's trace
            contexts = [contextvars.copy_context() for _ in rest]
            with ThreadPoolExecutor(max_workers=min(len(rest), 8)) as pool:
                for i, batch in zip(rest, pool.map(lambda c, i: c.run(self.get, keys[i], **opts), contexts, rest)):
                    batches[i] = batch
        return combine_inputs(keys, batches, columns)

    def delete(self, key: keys_pb2.BatchKey, *, timeout: float = 30.0) -> bool:
        return call(self._stub.DeleteBatch, pb.DeleteBatchRequest(key=key), timeout=timeout).deleted

    def delete_step(self, job_id: str, step: int, *, timeout: float = 60.0) -> StepDeletion:
        """Deletes every batch of one step of a job in one call; returns how many there were and the job's
        bytes just before (what `stats(job_id).bytes` said: a step's end needs no second call)."""
        reply = call(self._stub.DeleteStep, pb.DeleteStepRequest(job_id=job_id, step=step), timeout=timeout)
        return StepDeletion(reply.batches_deleted, reply.job_bytes_before)

    def list(self, job_id: str, step: int = -1, *, timeout: float = 30.0) -> list[keys_pb2.BatchKey]:
        reply = call(self._stub.ListBatches, pb.ListBatchesRequest(job_id=job_id, step=step), timeout=timeout)
        return list(reply.keys)

    def delete_job(self, job_id: str, *, timeout: float = 120.0) -> JobDeletion:
        reply = call(self._stub.DeleteJob, pb.DeleteJobRequest(job_id=job_id), timeout=timeout)
        return JobDeletion(reply.batches_deleted, reply.streams_deleted)

    # --- sample streams ---------------------------------------------------------------------
    def append_groups(
        self, job_id: str, stream: str, groups: Sequence[Group | pb.SampleGroup], *, timeout: float = 60.0
    ) -> list[str]:
        """Appends whole groups; returns their entry ids (large lists go in several requests)."""
        protos = [g.to_proto() if isinstance(g, Group) else g for g in groups]
        ids: list[str] = []
        part: list[pb.SampleGroup] = []
        size = 0
        for group in protos:
            n = group.ByteSize()
            if part and size + n > APPEND_REQUEST_BYTES:
                ids += self._append(job_id, stream, part, timeout)
                part, size = [], 0
            part.append(group)
            size += n
        if part or not ids:
            ids += self._append(job_id, stream, part, timeout)
        return ids

    def _append(self, job_id: str, stream: str, groups: list[pb.SampleGroup], timeout: float) -> list[str]:
        request = pb.AppendGroupsRequest(job_id=job_id, stream=stream, groups=groups)
        return list(call(self._stub.AppendGroups, request, timeout=timeout).entry_ids)

    def read_groups(
        self,
        job_id: str,
        stream: str,
        consumer_group: str,
        consumer: str,
        *,
        max_groups: int = 1,
        block_seconds: float = 0.0,
        min_weight_version: int = 0,
        claim_idle_seconds: float = 0.0,
        timeout: float = 30.0,
    ) -> ReadResult:
        """Up to `max_groups` groups for this consumer: first ones a dead consumer left unacked for
        `claim_idle_seconds` (0: the service default), then new ones, blocking up to `block_seconds`.
        Groups below `min_weight_version` are dropped and counted. Ack each delivered group."""
        request = pb.ReadGroupsRequest(
            job_id=job_id,
            stream=stream,
            consumer_group=consumer_group,
            consumer=consumer,
            max_groups=max_groups,
            block_seconds=block_seconds,
            min_weight_version=min_weight_version,
            claim_idle_seconds=claim_idle_seconds,
        )
        reply = call(self._stub.ReadGroups, request, timeout=block_seconds + timeout)
        groups = [
            DeliveredGroup(
                d.entry_id, d.group.group_id, d.group.weight_version, batch_from_proto(d.group.batch), d.delivery_count
            )
            for d in reply.groups
        ]
        return ReadResult(groups, reply.dropped_stale)

    def ack(
        self, job_id: str, stream: str, consumer_group: str, entry_ids: Sequence[str], *, timeout: float = 30.0
    ) -> int:
        """Acknowledges delivered groups; returns how many were pending (an id acked twice counts once)."""
        request = pb.AckGroupsRequest(job_id=job_id, stream=stream, consumer_group=consumer_group, entry_ids=entry_ids)
        return call(self._stub.AckGroups, request, timeout=timeout).acked

    # --- stats and lifecycle ----------------------------------------------------------------
    def stats(self, job_id: str = "", *, timeout: float = 30.0) -> BufferStats:
        reply = call(self._stub.GetStats, pb.GetStatsRequest(job_id=job_id), timeout=timeout)
        streams = [StreamStats(s.job_id, s.stream, s.consumer_group, s.length, s.pending, s.lag) for s in reply.streams]
        return BufferStats(
            reply.batches,
            reply.bytes,
            streams,
            dict(reply.drops_by_reason),
            reply.budget_bytes,
            reply.budget_entries,
            reply.get_calls,
            reply.get_bytes,
            reply.get_rows,
        )

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        self._channel.close()

    def __enter__(self) -> DataBufferClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
