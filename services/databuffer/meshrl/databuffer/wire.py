"""How the data buffer's requests are read off the wire: payload frames without copies, and
undecodable messages turned into INVALID_ARGUMENT that names the bad field (gRPC itself would
answer INTERNAL "Exception deserializing request").

A deserializer never raises: it returns the message, a payload frame (memoryview), or a
`BadRequest` that the servicer raises as the typed error. Used by meshrl.databuffer.server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.buffer_frames import (
    encode_head_and_payload,
    encode_payload_frame,
    payload_of,
    read_varint,
    split_head_and_payload,
)
from meshrl.common.errors import InvalidArgument


@dataclass(frozen=True)
class BadRequest:
    error: InvalidArgument


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, pos = read_varint(data, pos)
    if value < 0:
        raise ValueError("truncated varint")
    return value, pos


def find_bad_utf8(descriptor: Descriptor, data: bytes, prefix: str = "") -> str | None:
    """The path (e.g. 'groups[2].group_id') of the first string field that is not UTF-8, if any."""
    seen: dict[int, int] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = _varint(data, pos)
            continue
        if wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
            continue
        if wire_type != 2:
            return None
        length, pos = _varint(data, pos)
        chunk, pos = data[pos : pos + length], pos + length
        fd = descriptor.fields_by_number.get(number)
        if fd is None:
            continue
        name = prefix + fd.name
        if fd.is_repeated:
            index = seen.get(number, 0)
            seen[number] = index + 1
            name = f"{name}[{index}]"
        if fd.type == FieldDescriptor.TYPE_STRING:
            try:
                bytes(chunk).decode("utf-8")
            except UnicodeDecodeError:
                return name
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            inner = find_bad_utf8(fd.message_type, chunk, name + ".")
            if inner:
                return inner
    return None


def lenient(message_type: type[Message]) -> Callable[[bytes], Message | BadRequest]:
    def deserialize(raw: bytes) -> Message | BadRequest:
        try:
            return message_type.FromString(raw)
        except (DecodeError, ValueError) as exc:
            try:
                field = find_bad_utf8(message_type.DESCRIPTOR, raw)
            except (ValueError, IndexError):
                field = None
            name = message_type.DESCRIPTOR.name
            if field:
                text = f"{field} is not valid UTF-8; names and ids must be UTF-8 text"
                return BadRequest(InvalidArgument(text, field=field))
            return BadRequest(InvalidArgument(f"the request is not a valid {name} message ({exc})"))

    return deserialize


_put_message = lenient(pb.PutBatchRequest)


def deserialize_put(raw: bytes) -> pb.PutBatchRequest | memoryview | BadRequest:
    frame = payload_of(raw)
    return frame if frame is not None else _put_message(raw)


_small_put_message = lenient(pb.PutSmallBatchRequest)


def deserialize_small_put(raw: bytes) -> tuple[pb.PutBatchStart, memoryview] | pb.PutSmallBatchRequest | BadRequest:
    """(start, payload view) of a PutSmallBatchRequest laid out as the client writes it (start, then payload;
    no copy of the payload), else the message parsed by protobuf (or the BadRequest it deserved)."""
    parts = split_head_and_payload(raw)
    if parts is not None:
        try:
            return pb.PutBatchStart.FromString(parts[0]), parts[1]
        except DecodeError:
            pass  # a bad `start`: the whole message's parse below names the field (BadRequest)
    return _small_put_message(raw)


def serialize_small_get(reply: tuple[Any, list[Any]] | pb.GetSmallBatchResponse) -> bytes:
    """(header, chunks) as a GetSmallBatchResponse with the payload joined once; a message as itself."""
    if isinstance(reply, pb.GetSmallBatchResponse):
        return reply.SerializeToString()
    header, chunks = reply
    return encode_head_and_payload(header.SerializeToString(), chunks)


def serialize_get(reply: pb.GetBatchResponse | bytes | memoryview) -> bytes:
    if isinstance(reply, bytes | bytearray | memoryview):
        return encode_payload_frame(reply)
    return reply.SerializeToString()


def checked(request: Any) -> Any:
    """The request, or the typed error its bytes deserved."""
    if isinstance(request, BadRequest):
        raise request.error
    return request


def split_put_stream(requests: Iterable[Any]) -> tuple[pb.PutBatchStart, Iterator[memoryview]]:
    """The `start` message of a PutBatch stream and an iterator over its payload frames."""
    stream = iter(requests)
    first = checked(next(stream, None))
    if not isinstance(first, pb.PutBatchRequest) or first.WhichOneof("body") != "start":
        raise InvalidArgument("start: the first PutBatch message must be `start` (key, header), then payload frames")

    def frames() -> Iterator[memoryview]:
        for request in stream:
            request = checked(request)
            if isinstance(request, memoryview):
                yield request
            elif request.WhichOneof("body") == "payload":
                yield memoryview(request.payload)
            else:
                raise InvalidArgument("start: a PutBatch stream carries one `start`, and it must come first")

    return first.start, frames()
