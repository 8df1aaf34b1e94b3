"""The DataBuffer gRPC servicer: proto in, `DataBuffer` (meshrl.databuffer.store) call, proto out.

Registered by `__main__` through `service(buffer)`, with the wire helpers of
meshrl.databuffer.wire as (de)serializers so payload frames are not copied through messages.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import grpc

from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.databuffer_client import SERVICE
from meshrl.common.errors import InvalidArgument
from meshrl.common.grpc_server import Service
from meshrl.common.telemetry import attributes as A
from meshrl.common.telemetry import tag_span
from meshrl.databuffer.keys import BatchRef
from meshrl.databuffer.store import DataBuffer
from meshrl.databuffer.wire import (
    checked,
    deserialize_put,
    deserialize_small_put,
    lenient,
    serialize_get,
    serialize_small_get,
    split_put_stream,
)


def _remaining(context: grpc.ServicerContext, wanted: float, field: str, margin: float = 0.5) -> float:
    """`wanted` seconds, cut so that the answer still arrives before the caller's deadline; a negative or
    non-finite wait is refused (it was cut to 0 before, and a NaN passed every bound)."""
    if not math.isfinite(wanted) or wanted < 0:
        raise InvalidArgument(f"{field} = {wanted} must be a finite number of seconds >= 0", field=field)
    left = context.time_remaining()
    return wanted if left is None else max(0.0, min(wanted, left - margin))


class DataBufferServicer:
    def __init__(self, buffer: DataBuffer) -> None:
        self.buffer = buffer
        self.frame_bytes = buffer.cfg.limits.max_frame_bytes

    def PutBatch(self, requests: Iterator[Any], context: grpc.ServicerContext) -> pb.PutBatchResponse:
        start, frames = split_put_stream(requests)
        ref = BatchRef.from_proto(start.key, "start.key")
        result = self.buffer.put_batch(
            ref, start.header, frames, ttl_seconds=start.ttl_seconds, overwrite=start.overwrite
        )
        tag_span({A.BUFFER_KEY: str(ref), A.BYTES: result.bytes_written})
        return pb.PutBatchResponse(bytes_written=result.bytes_written, chunks=result.chunks)

    def PutSmallBatch(self, request: Any, context: grpc.ServicerContext) -> pb.PutBatchResponse:
        request = checked(request)
        start, payload = request if isinstance(request, tuple) else (request.start, memoryview(request.payload))
        ref = BatchRef.from_proto(start.key, "start.key")
        if payload.nbytes > self.frame_bytes:
            raise InvalidArgument(
                f"payload: {payload.nbytes} bytes is over limits.max_frame_bytes = {self.frame_bytes} for "
                "PutSmallBatch; stream larger batches with PutBatch",
                field="payload",
            )
        result = self.buffer.put_batch(
            ref, start.header, [payload], ttl_seconds=start.ttl_seconds, overwrite=start.overwrite
        )
        tag_span({A.BUFFER_KEY: str(ref), A.BYTES: result.bytes_written})
        return pb.PutBatchResponse(bytes_written=result.bytes_written, chunks=result.chunks)

    def GetBatch(self, request: pb.GetBatchRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        stored = self._open(checked(request), context)
        yield pb.GetBatchResponse(header=stored.header)
        for chunk in stored.chunks:
            if len(chunk) <= self.frame_bytes:
                yield chunk
            else:
                view = memoryview(chunk)
                for i in range(0, len(chunk), self.frame_bytes):
                    yield view[i : i + self.frame_bytes]

    def GetSmallBatch(self, request: pb.GetBatchRequest, context: grpc.ServicerContext) -> Any:
        """The whole reply in one message (header, then the payload joined once), or too_large."""
        stored = self._open(checked(request), context, limit=self.frame_bytes)
        if stored.chunks is None:
            return pb.GetSmallBatchResponse(too_large=True)
        return stored.header, list(stored.chunks)

    def GetSmallBatches(self, request: Any, context: grpc.ServicerContext) -> pb.GetSmallBatchesResponse:
        """Each get as GetSmallBatch answers it, while the payloads together fit in limit_bytes."""
        request = checked(request)
        if request.limit_bytes < 0:
            raise InvalidArgument(f"limit_bytes = {request.limit_bytes} must be >= 0", field="limit_bytes")
        left = min(request.limit_bytes or self.frame_bytes, self.frame_bytes)
        replies, sent, keys = [], 0, []
        for get in request.gets:
            stored = self._open(get, context, limit=left, tag=False)
            if stored.chunks is None:
                replies.append(pb.GetSmallBatchResponse(too_large=True))
                continue
            payload = b"".join(stored.chunks)
            left -= len(payload)
            sent += len(payload)
            keys.append(str(stored.ref))
            replies.append(pb.GetSmallBatchResponse(header=stored.header, payload=payload))
        tag_span({A.BUFFER_KEYS: keys, A.BYTES: sent})
        return pb.GetSmallBatchesResponse(batches=replies)

    def _open(
        self, request: pb.GetBatchRequest, context: grpc.ServicerContext, limit: int | None = None, tag: bool = True
    ) -> Any:
        """The requested columns and rows of one batch (waiting up to the call's deadline), tagged on the span."""
        ref = BatchRef.from_proto(request.key)
        rows = (request.rows.begin, request.rows.end) if request.HasField("rows") else None
        stored = self.buffer.open_batch(
            ref,
            wait_seconds=_remaining(context, request.wait_seconds, "wait_seconds"),
            columns=list(request.columns),
            rows=rows,
            missing_ok=request.missing_ok,
            limit=limit,
        )
        if stored.chunks is not None and tag:
            tag_span({A.BUFFER_KEY: str(ref), A.BYTES: stored.header.total_bytes})
        return stored

    def DeleteBatch(self, request: pb.DeleteBatchRequest, context: grpc.ServicerContext) -> pb.DeleteBatchResponse:
        request = checked(request)
        return pb.DeleteBatchResponse(deleted=self.buffer.delete_batch(BatchRef.from_proto(request.key)))

    def DeleteStep(self, request: pb.DeleteStepRequest, context: grpc.ServicerContext) -> pb.DeleteStepResponse:
        request = checked(request)
        deleted, held = self.buffer.delete_step(request.job_id, request.step)
        return pb.DeleteStepResponse(batches_deleted=deleted, job_bytes_before=held)

    def DescribeDirectPath(self, request: Any, context: grpc.ServicerContext) -> pb.DescribeDirectPathResponse:
        checked(request)
        layout = self.buffer.direct_layout()
        return pb.DescribeDirectPathResponse(
            chunk_key_template=layout.chunk_key_template,
            chunk_bytes=layout.chunk_bytes,
            staging_ttl_ms=layout.staging_ttl_ms,
            max_batch_bytes=layout.max_batch_bytes,
            redis_hint=self.buffer.redis_hint(),
            zero_rpc=pb.ZeroRpcPath(**asdict(layout.zero_rpc)) if layout.zero_rpc else None,
        )

    def CommitDirectPut(self, request: pb.CommitDirectPutRequest, context: grpc.ServicerContext) -> Any:
        request = checked(request)
        start = request.start
        ref = BatchRef.from_proto(start.key, "start.key")
        result = self.buffer.commit_direct_put(
            ref,
            start.header,
            request.generation,
            request.chunks,
            ttl_seconds=start.ttl_seconds,
            overwrite=start.overwrite,
        )
        tag_span({A.BUFFER_KEY: str(ref), A.BYTES: result.bytes_written})
        return pb.PutBatchResponse(bytes_written=result.bytes_written, chunks=result.chunks)

    def LocateBatch(self, request: pb.GetBatchRequest, context: grpc.ServicerContext) -> pb.LocateBatchResponse:
        request = checked(request)
        ref = BatchRef.from_proto(request.key)
        rows = (request.rows.begin, request.rows.end) if request.HasField("rows") else None
        located = self.buffer.locate_batch(
            ref,
            wait_seconds=_remaining(context, request.wait_seconds, "wait_seconds"),
            columns=list(request.columns),
            rows=rows,
            missing_ok=request.missing_ok,
            inline_below=request.inline_below,
        )
        tag_span({A.BUFFER_KEY: str(ref), A.BYTES: located.header.total_bytes})
        ranges = [pb.ValueRange(key=k, first=a, last=b, whole=w) for k, a, b, w in located.ranges]
        return pb.LocateBatchResponse(
            header=located.header,
            ranges=ranges,
            manifest_key=located.manifest_key,
            generation=located.generation,
            inline=located.payload is not None,
            payload=located.payload or b"",
        )

    def ListBatches(self, request: pb.ListBatchesRequest, context: grpc.ServicerContext) -> pb.ListBatchesResponse:
        request = checked(request)
        refs = self.buffer.list_batches(request.job_id, request.step)
        return pb.ListBatchesResponse(keys=[r.to_proto() for r in refs])

    def DeleteJob(self, request: pb.DeleteJobRequest, context: grpc.ServicerContext) -> pb.DeleteJobResponse:
        request = checked(request)
        batches, streams = self.buffer.delete_job(request.job_id)
        return pb.DeleteJobResponse(batches_deleted=batches, streams_deleted=streams)

    def AppendGroups(self, request: pb.AppendGroupsRequest, context: grpc.ServicerContext) -> pb.AppendGroupsResponse:
        request = checked(request)
        ids = self.buffer.append_groups(request.job_id, request.stream, request.groups)
        return pb.AppendGroupsResponse(entry_ids=ids)

    def ReadGroups(self, request: pb.ReadGroupsRequest, context: grpc.ServicerContext) -> pb.ReadGroupsResponse:
        request = checked(request)
        request.block_seconds = _remaining(context, request.block_seconds, "block_seconds")
        result = self.buffer.read(request)
        groups = [
            pb.DeliveredGroup(entry_id=d.entry_id, group=d.group, delivery_count=d.delivery_count)
            for d in result.groups
        ]
        return pb.ReadGroupsResponse(groups=groups, dropped_stale=result.dropped_stale)

    def AckGroups(self, request: pb.AckGroupsRequest, context: grpc.ServicerContext) -> pb.AckGroupsResponse:
        request = checked(request)
        acked = self.buffer.ack_groups(request.job_id, request.stream, request.consumer_group, request.entry_ids)
        return pb.AckGroupsResponse(acked=acked)

    def GetStats(self, request: pb.GetStatsRequest, context: grpc.ServicerContext) -> pb.GetStatsResponse:
        request = checked(request)
        stats = self.buffer.stats(request.job_id)
        streams = [
            pb.StreamStats(
                job_id=s.job_id,
                stream=s.stream,
                consumer_group=s.consumer_group,
                length=s.length,
                pending=s.pending,
                lag=s.lag,
            )
            for s in stats.streams
        ]
        return pb.GetStatsResponse(
            batches=stats.batches,
            bytes=stats.bytes,
            streams=streams,
            drops_by_reason=stats.drops_by_reason,
            budget_bytes=stats.budget_bytes,
            budget_entries=stats.budget_entries,
            get_calls=stats.get_calls,
            get_bytes=stats.get_bytes,
            get_rows=stats.get_rows,
        )


def _add(servicer: DataBufferServicer, server: grpc.Server) -> None:
    """Like the generated add_DataBufferServicer_to_server, with meshrl.databuffer.wire's (de)serializers."""

    replies = {"CommitDirectPut": "PutBatch", "LocateBatch": "LocateBatch"}
    requests = {"LocateBatch": "GetBatch"}

    def reply(name: str) -> Any:
        return getattr(pb, f"{replies.get(name, name)}Response").SerializeToString

    handlers = {
        "PutBatch": grpc.stream_unary_rpc_method_handler(
            servicer.PutBatch, request_deserializer=deserialize_put, response_serializer=reply("PutBatch")
        ),
        "GetBatch": grpc.unary_stream_rpc_method_handler(
            servicer.GetBatch, request_deserializer=lenient(pb.GetBatchRequest), response_serializer=serialize_get
        ),
    }
    handlers["GetSmallBatch"] = grpc.unary_unary_rpc_method_handler(
        servicer.GetSmallBatch,
        request_deserializer=lenient(pb.GetBatchRequest),
        response_serializer=serialize_small_get,
    )
    handlers["PutSmallBatch"] = grpc.unary_unary_rpc_method_handler(
        servicer.PutSmallBatch, request_deserializer=deserialize_small_put, response_serializer=reply("PutBatch")
    )
    for name in (
        "DeleteBatch",
        "DeleteStep",
        "ListBatches",
        "DeleteJob",
        "AppendGroups",
        "ReadGroups",
        "AckGroups",
        "GetStats",
        "DescribeDirectPath",
        "CommitDirectPut",
        "LocateBatch",
        "GetSmallBatches",
    ):
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=lenient(getattr(pb, f"{requests.get(name, name)}Request")),
            response_serializer=reply(name),
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def service(buffer: DataBuffer) -> Service:
    """What `start_server` needs to serve `buffer`."""
    return Service(_add, DataBufferServicer(buffer), SERVICE)
