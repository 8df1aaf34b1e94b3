"""The data buffer's wire helpers (payload frames in protobuf's own format, UTF-8 field finder),
its config checks, and the Redis key layout (one hash tag per batch / stream)."""

from __future__ import annotations

import numpy as np
import pytest
from redis.cluster import key_slot

from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.batch_key import batch_key
from meshrl.common.buffer_frames import (
    encode_head_and_payload,
    encode_payload_frame,
    payload_of,
    split_frames,
    split_head_and_payload,
)
from meshrl.common.config import load_config
from meshrl.common.databuffer_client import deserialize_get_response, serialize_put_request
from meshrl.common.errors import ConfigError, InvalidArgument
from meshrl.databuffer.config import DataBufferConfig
from meshrl.databuffer.keys import BatchRef, KeySpace
from meshrl.databuffer.wire import BadRequest, checked, deserialize_put, find_bad_utf8, lenient, split_put_stream


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 1 << 20])
def test_payload_frames_are_exactly_what_protobuf_writes(size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    for message in (pb.PutBatchRequest(payload=data), pb.GetBatchResponse(payload=data)):
        assert encode_payload_frame(memoryview(data)) == message.SerializeToString()
    frame = payload_of(pb.PutBatchRequest(payload=data).SerializeToString())
    assert frame is not None and bytes(frame) == data


def test_other_messages_take_the_protobuf_path():
    start = pb.PutBatchRequest(start=pb.PutBatchStart(key=batch_key("j", 1, "n")))
    assert payload_of(start.SerializeToString()) is None
    assert isinstance(deserialize_put(start.SerializeToString()), pb.PutBatchRequest)
    assert serialize_put_request(start) == start.SerializeToString()
    header = pb.GetBatchResponse(header={"total_bytes": 3})
    assert deserialize_get_response(header.SerializeToString()) == header
    trailing = pb.PutBatchRequest(payload=b"abc").SerializeToString() + b"\x08\x01"  # payload plus an unknown field
    assert payload_of(trailing) is None


def test_head_and_payload_round_trip_and_refuse_every_other_layout():
    raw = encode_head_and_payload(b"head", [memoryview(b"ab"), b"cd"])
    head, payload = split_head_and_payload(raw)
    assert head == b"head" and bytes(payload) == b"abcd"
    for other in (raw[:-1], raw + b"x", raw[1:], b"", b"\x0a\xff"):  # truncated, trailing, no head, empty, bad varint
        assert split_head_and_payload(other) is None


def test_split_frames_slices_big_views_and_joins_small_ones():
    views = [memoryview(b"a" * 10), memoryview(b"b" * 3), memoryview(b"c" * 2)]
    assert [bytes(f) for f in split_frames(views, 4)] == [b"aaaa", b"aaaa", b"aabb", b"bcc"]
    assert list(split_frames([memoryview(b"")], 4)) == []


def test_undecodable_requests_name_the_non_utf8_field():
    bad = b"\x0a\x03job\x12\x02s1\x1a\x05\x0a\x03\xff\xfe\xfd"  # AppendGroupsRequest with groups[0].group_id not UTF-8
    assert find_bad_utf8(pb.AppendGroupsRequest.DESCRIPTOR, bad) == "groups[0].group_id"
    result = lenient(pb.AppendGroupsRequest)(bad)
    assert isinstance(result, BadRequest)
    with pytest.raises(InvalidArgument, match=r"^groups\[0\].group_id is not valid UTF-8"):
        checked(result)
    garbage = lenient(pb.ListBatchesRequest)(b"\x0a\x10short")
    with pytest.raises(InvalidArgument, match="not a valid ListBatchesRequest message"):
        checked(garbage)


def test_put_stream_must_start_with_start():
    frame = memoryview(b"data")
    with pytest.raises(InvalidArgument, match="^start: the first PutBatch message must be `start`"):
        split_put_stream(iter([frame]))
    start = pb.PutBatchRequest(start=pb.PutBatchStart(key=batch_key("j", 1, "n")))
    _, frames = split_put_stream(iter([start, frame, start]))
    with pytest.raises(InvalidArgument, match="carries one `start`"):
        list(frames)


def test_config_names_the_bad_field():
    with pytest.raises(ConfigError, match=r"redis.url.*scheme 'http' is not one of"):
        load_config(DataBufferConfig, overrides=["redis.url=http://x"], env={})
    with pytest.raises(ConfigError, match=r"limits.chunk_bytes"):
        load_config(DataBufferConfig, overrides=["limits.chunk_bytes=1073741824"], env={})
    with pytest.raises(ConfigError, match=r"must stay below server.max_message_bytes"):
        load_config(DataBufferConfig, overrides=["limits.max_frame_bytes=134217728"], env={})
    cfg = load_config(
        DataBufferConfig, env={"MESHRL_REDIS__URL": "unix:///tmp/r.sock", "MESHRL_BUDGET__MAX_BYTES": "5"}
    )
    assert cfg.redis.url == "unix:///tmp/r.sock" and cfg.budget.max_bytes == 5 and cfg.server.port == 50051


def test_one_batch_shares_one_cluster_slot():
    keys = KeySpace("p")
    ref = BatchRef("job", 7, "rollout", 2)
    slots = {key_slot(k.encode()) for k in [keys.manifest(ref), *keys.chunks(ref, "abc", 5)]}
    assert len(slots) == 1
    assert key_slot(keys.stream("job", "s").encode()) == key_slot(keys.stream_meta("job", "s").encode())
    assert len({key_slot(k.encode()) for k in keys.ledger()}) == 1
    assert np.unique([key_slot(keys.manifest(BatchRef("job", s, "n")).encode()) for s in range(50)]).size > 40
