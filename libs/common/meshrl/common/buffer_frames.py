"""The data buffer's payload frames in protobuf wire format, shared by the client and the service.

Bulk bytes never go through protobuf objects: a message whose only field is `payload` is written
and read as tag + length + bytes (one copy), and a small put/get is `start`/`header`, then
`payload`, laid out the same way. Anything else is left to protobuf (None / no match here).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

PAYLOAD_TAG = b"\x12"  # field 2, wire type 2: `payload` of PutBatchRequest and of GetBatchResponse
START_TAG = b"\x0a"  # field 1, wire type 2: `start` of PutSmallBatchRequest, `header` of GetSmallBatchResponse


def encode_varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, position after it); (-1, past the end) for a truncated or over-long varint."""
    value, shift = 0, 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
    return -1, len(data) + 1


def encode_payload_frame(data: bytes | bytearray | memoryview) -> bytes:
    """The serialized message whose only field is `payload = data` (one copy of data)."""
    return b"".join((PAYLOAD_TAG, encode_varint(memoryview(data).nbytes), data))


def payload_of(raw: bytes) -> memoryview | None:
    """The payload of a message holding only `payload`, as a view of `raw`; None for any other message."""
    if raw[:1] != PAYLOAD_TAG:
        return None
    length, pos = read_varint(raw, 1)
    return memoryview(raw)[pos:] if length >= 0 and pos + length == len(raw) else None


def encode_head_and_payload(head: bytes, views: Sequence[bytes | memoryview]) -> bytes:
    """`head` as field 1, then the views joined as field 2 (one copy of the payload)."""
    size = sum(memoryview(v).nbytes for v in views)
    return b"".join((START_TAG, encode_varint(len(head)), head, PAYLOAD_TAG, encode_varint(size), *views))


def split_head_and_payload(raw: bytes) -> tuple[bytes, memoryview] | None:
    """(head bytes, payload view) of a message laid out as `encode_head_and_payload` writes it, else None."""
    if raw[:1] != START_TAG:
        return None
    size, pos = read_varint(raw, 1)
    if size < 0:
        return None
    head, pos = raw[pos : pos + size], pos + size
    if raw[pos : pos + 1] != PAYLOAD_TAG:
        return None
    length, pos = read_varint(raw, pos + 1)
    if length < 0 or pos + length != len(raw):
        return None
    return head, memoryview(raw)[pos:]


def split_frames(views: Iterable[memoryview], frame_bytes: int) -> Iterator[bytes | memoryview]:
    """Cuts the payload into frames of `frame_bytes` (slices of big tensors, small tensors joined)."""
    parts: list[memoryview] = []
    size = 0
    for view in views:
        n, pos = view.nbytes, 0
        while pos < n:
            if not parts and n - pos >= frame_bytes:
                yield view[pos : pos + frame_bytes]
                pos += frame_bytes
                continue
            take = min(frame_bytes - size, n - pos)
            parts.append(view[pos : pos + take])
            size += take
            pos += take
            if size == frame_bytes:
                yield b"".join(parts)
                parts, size = [], 0
    if parts:
        yield parts[0] if len(parts) == 1 else b"".join(parts)  # a lone tail (a small batch's one tensor): uncopied
