"""The data buffer client's wire helpers (meshrl.common.databuffer_client): payload frames are written straight
in protobuf's wire format (`payload` = field 2, length-delimited, the same bytes the generated code would
produce), so neither side copies the bytes through message objects; the service uses the same helpers.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshrl.api.common.v1 import tensor_pb2
from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.buffer_frames import (
    encode_head_and_payload,
    encode_payload_frame,
    payload_of,
    split_head_and_payload,
)


def serialize_put_request(message: pb.PutBatchRequest | bytes | bytearray | memoryview) -> bytes:
    if isinstance(message, bytes | bytearray | memoryview):
        return encode_payload_frame(message)
    return message.SerializeToString()


def encode_small_put(start: pb.PutBatchStart, views: Sequence[memoryview]) -> bytes:
    """A serialized PutSmallBatchRequest (`start`, then `payload` = the views joined) with one copy of the payload."""
    return encode_head_and_payload(start.SerializeToString(), views)


def deserialize_small_get(raw: bytes) -> tuple[tensor_pb2.BatchHeader, memoryview] | pb.GetSmallBatchResponse:
    """(header, payload view) of a GetSmallBatchResponse as the service writes it, else the parsed message."""
    parts = split_head_and_payload(raw)
    if parts is not None:
        return tensor_pb2.BatchHeader.FromString(parts[0]), parts[1]
    return pb.GetSmallBatchResponse.FromString(raw)


def deserialize_get_response(raw: bytes) -> pb.GetBatchResponse | memoryview:
    frame = payload_of(raw)
    return frame if frame is not None else pb.GetBatchResponse.FromString(raw)
