"""Keyed batches in-process (no gRPC) on a real Redis (the machine's Redis 7 and the embedded 6.2):
bit-exact round trips of every dtype, ragged and empty columns, chunking, atomic puts that
leave nothing behind when they fail, waiting gets, TTLs, listing, deletion and the budget."""

from __future__ import annotations

import threading
import time

import ml_dtypes
import numpy as np
import pytest

from meshrl.api.common.v1 import keys_pb2, tensor_pb2
from meshrl.common.codec import NUMPY_BY_DTYPE, Ragged, encode_batch
from meshrl.common.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted
from meshrl.databuffer.keys import BatchRef
from tests._databuffer import snapshot

KiB = 1024


def _all_dtype_columns(rows: int = 4) -> dict:
    rng = np.random.default_rng(0)
    cols = {}
    for dtype in NUMPY_BY_DTYPE.values():
        raw = rng.integers(0, 256, size=rows * 3 * dtype.itemsize, dtype=np.uint8)
        cols[f"c_{dtype.name}"] = raw.view(dtype).reshape(rows, 3)  # every bit pattern, NaNs included
    cols["ragged"] = Ragged.from_rows([[1, 2, 3], [], [4], [5, 6]], dtype=np.int32)
    cols["ragged_2d"] = Ragged.from_rows([np.ones((2, 2)), np.zeros((0, 2)), np.ones((1, 2)), np.ones((3, 2))])
    cols["empty_rows"] = np.zeros((rows, 0), dtype=np.float32)
    return cols


def _same(a, b) -> bool:
    if isinstance(a, Ragged):
        return _same(a.values, b.values) and np.array_equal(a.offsets, b.offsets)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_every_dtype_ragged_and_empty_columns_round_trip_bit_exact(buffer):
    ref = BatchRef("job", 0, "rollout")
    cols = _all_dtype_columns()
    samples = [tensor_pb2.SampleMeta(group_id=f"g{i // 2}", index_in_group=i % 2, weight_version=3) for i in range(4)]
    buffer.put_columns(ref, cols, samples, {"origin": "test"})
    got = buffer.get_batch(ref)
    assert set(got.columns) == set(cols)
    assert all(_same(cols[name], got.columns[name]) for name in cols)
    assert got["c_bfloat16"].dtype == ml_dtypes.bfloat16
    assert list(got.samples) == samples and got.attrs == {"origin": "test"}


def test_zero_length_and_column_free_batches(buffer):
    buffer.put_columns(BatchRef("job", 1, "empty"), {"x": np.zeros((0, 5), np.int64), "r": Ragged.from_rows([])})
    got = buffer.get_batch(BatchRef("job", 1, "empty"))
    assert got["x"].shape == (0, 5) and len(got["r"]) == 0
    result = buffer.put_columns(BatchRef("job", 1, "nothing"), {}, attrs={"note": "no tensors"})
    assert result.chunks == 0 and buffer.get_batch(BatchRef("job", 1, "nothing")).attrs == {"note": "no tensors"}


def test_payload_is_chunked_and_reassembled_across_odd_frames(make_buffer):
    buffer = make_buffer(limits={"chunk_bytes": 64 * KiB})
    data = np.random.default_rng(1).integers(0, 256, size=1_000_003, dtype=np.uint8)
    header, views = encode_batch({"data": data})
    frames = (views[0][i : i + 100_003] for i in range(0, data.nbytes, 100_003))
    result = buffer.put_batch(BatchRef("job", 2, "big", shard=3), header, frames)
    assert result.chunks == -(-data.nbytes // (64 * KiB)) and result.bytes_written == data.nbytes
    assert buffer.get_batch(BatchRef("job", 2, "big", shard=3))["data"].tobytes() == data.tobytes()


def _frames_then_fail(views, after: int):
    sent = 0
    for view in views:
        for i in range(0, view.nbytes, 50 * KiB):
            if sent >= after:
                raise ConnectionResetError("client went away mid-put")
            sent += min(50 * KiB, view.nbytes - i)
            yield view[i : i + 50 * KiB]


def test_a_put_that_fails_midway_leaves_the_store_unchanged(make_buffer, backend):
    buffer = make_buffer(limits={"chunk_bytes": 64 * KiB})
    ref = BatchRef("job", 3, "node")
    buffer.put_columns(ref, {"v": np.arange(10)})  # an existing batch must survive a failed overwrite
    before = snapshot(backend[1], buffer.keys.prefix)
    header, views = encode_batch({"v": np.arange(200_000)})
    with pytest.raises(ConnectionResetError):
        buffer.put_batch(ref, header, _frames_then_fail(views, after=700 * KiB))
    with pytest.raises(InvalidArgument, match=r"^payload: the stream ended after 51200 of the 1600000 bytes"):
        buffer.put_batch(ref, header, [views[0][: 50 * KiB]])
    with pytest.raises(InvalidArgument, match=r"^payload: more bytes than start.header.total_bytes = 1600000"):
        buffer.put_batch(ref, header, [views[0], b"x"])
    assert snapshot(backend[1], buffer.keys.prefix) == before
    assert np.array_equal(buffer.get_batch(ref)["v"], np.arange(10))


def test_overwrite_false_refuses_and_overwrite_replaces(buffer):
    ref = BatchRef("job", 4, "node")
    buffer.put_columns(ref, {"v": np.arange(3)})
    with pytest.raises(AlreadyExists, match="overwrite=True"):
        buffer.put_columns(ref, {"v": np.arange(4)}, overwrite=False)
    buffer.put_columns(ref, {"v": np.arange(5)})
    assert np.array_equal(buffer.get_batch(ref)["v"], np.arange(5))
    assert buffer.delete_batch(ref) and not buffer.delete_batch(ref)
    assert not any(buffer.handle.client.scan_iter(match="{" + buffer.keys.batch_tag(ref) + "}*"))


def test_ttl_applies_to_manifest_and_chunks_outlive_it(buffer):
    ref = BatchRef("job", 5, "node")
    buffer.put_columns(ref, {"v": np.arange(1000)}, ttl_seconds=30)
    client = buffer.handle.client
    manifest_ttl = client.pttl(buffer.keys.manifest(ref))
    chunk_ttls = [client.pttl(k) for k in client.scan_iter(match="{" + buffer.keys.batch_tag(ref) + "}:c:*")]
    assert 25_000 < manifest_ttl <= 30_000
    assert chunk_ttls and all(manifest_ttl < t <= 90_000 for t in chunk_ttls)
    buffer.put_columns(BatchRef("job", 5, "default"), {"v": np.arange(3)})
    assert client.pttl(buffer.keys.manifest(BatchRef("job", 5, "default"))) > 86_000_000


def test_get_waits_for_a_batch_and_wakes_on_its_commit(make_buffer):
    producer = make_buffer()
    consumer = make_buffer(batches={"poll_seconds": 5.0})  # only the pub/sub notification can wake it early
    ref = BatchRef("job", 6, "late")
    timer = threading.Timer(0.3, producer.put_columns, args=(ref, {"v": np.arange(7)}))
    start = time.monotonic()
    timer.start()
    got = consumer.get_batch(ref, wait_seconds=10)
    assert np.array_equal(got["v"], np.arange(7)) and time.monotonic() - start < 2.5
    start = time.monotonic()
    with pytest.raises(NotFound, match="after waiting 0.3s"):
        consumer.get_batch(BatchRef("job", 6, "never"), wait_seconds=0.3)
    assert time.monotonic() - start >= 0.3


def test_list_delete_and_delete_job(buffer):
    refs = [BatchRef("jobL", s, n, sh) for s in (0, 1) for n in ("a", "b") for sh in (None, 2)]
    for ref in refs:
        buffer.put_columns(ref, {"v": np.arange(2)})
    buffer.put_columns(BatchRef("other", 0, "a"), {"v": np.arange(2)})
    assert buffer.list_batches("jobL") == sorted(refs)
    assert buffer.list_batches("jobL", 1) == sorted(r for r in refs if r.step == 1)
    assert buffer.delete_batch(refs[0])
    assert refs[0] not in buffer.list_batches("jobL")
    assert buffer.delete_job("jobL") == (len(refs) - 1, 0)
    assert buffer.list_batches("jobL") == [] and buffer.stats("jobL").batches == 0
    assert buffer.list_batches("other") == [BatchRef("other", 0, "a")]


def test_budget_refuses_writes_with_the_budget_in_the_message_and_frees_on_delete(make_buffer, backend):
    buffer = make_buffer(budget={"max_bytes": 1_000_000, "max_entries": 3})
    buffer.put_columns(BatchRef("job", 7, "a"), {"v": np.zeros(600_000, np.uint8)})
    before = snapshot(backend[1], buffer.keys.prefix)
    with pytest.raises(ResourceExhausted, match=r"budget.max_bytes = 1000000 bytes"):
        buffer.put_columns(BatchRef("job", 7, "b"), {"v": np.zeros(600_000, np.uint8)})
    assert snapshot(backend[1], buffer.keys.prefix) == before
    buffer.delete_batch(BatchRef("job", 7, "a"))
    buffer.put_columns(BatchRef("job", 7, "b"), {"v": np.zeros(600_000, np.uint8)})
    for node in ("c", "d"):
        buffer.put_columns(BatchRef("job", 7, node), {"v": np.zeros(1, np.uint8)})
    with pytest.raises(ResourceExhausted, match=r"3 of budget.max_entries = 3 entries"):
        buffer.put_columns(BatchRef("job", 7, "e"), {"v": np.zeros(1, np.uint8)})
    stats = buffer.stats()
    assert stats.budget_bytes == 1_000_000 and stats.used_entries == 3 and stats.batches == 3


@pytest.mark.parametrize(
    "key, match",
    [
        (keys_pb2.BatchKey(job_id="a/b", step=0, node_id="n"), r"start.key.job_id = 'a/b' is not a valid name"),
        (keys_pb2.BatchKey(job_id="j", step=-1, node_id="n"), r"start.key.step = -1 must be"),
        (keys_pb2.BatchKey(job_id="j", step=0, node_id="n" * 129), r"start.key.node_id = 'nnnn"),
        (keys_pb2.BatchKey(job_id="j", step=0, node_id=""), r"start.key.node_id = '' is not a valid name"),
        (keys_pb2.BatchKey(job_id="j", step=0, node_id="n", shard=4), r"start.key.shard = 4 but start.key.has_shard"),
        (keys_pb2.BatchKey(job_id="j", step=0, node_id="n", shard=-2, has_shard=True), r"start.key.shard = -2"),
    ],
)
def test_bad_keys_name_the_field(key, match):
    with pytest.raises(InvalidArgument, match=match):
        BatchRef.from_proto(key, "start.key")


def test_bad_headers_name_the_field_and_change_nothing(buffer, backend):
    header, _ = encode_batch({"x": np.zeros((2, 3), np.float32)})
    cases = []
    wrong_dtype = tensor_pb2.BatchHeader.FromString(header.SerializeToString())
    wrong_dtype.tensors[0].dtype = 42
    cases.append((wrong_dtype, r"start.header.tensors\['x'\].dtype = 42 is not a supported dtype"))
    wrong_shape = tensor_pb2.BatchHeader.FromString(header.SerializeToString())
    wrong_shape.tensors[0].shape[:] = [2, -3]
    cases.append((wrong_shape, r"start.header.tensors\['x'\].shape = \[2, -3\] has a negative dimension"))
    wrong_bytes = tensor_pb2.BatchHeader.FromString(header.SerializeToString())
    wrong_bytes.tensors[0].nbytes = 7
    cases.append((wrong_bytes, r"start.header.tensors\['x'\].nbytes = 7 but shape"))
    big_header = tensor_pb2.BatchHeader.FromString(header.SerializeToString())
    big_header.attrs["blob"] = "x" * 20_000_000
    cases.append((big_header, r"start.header is \d+ bytes, over limits.max_header_bytes"))
    before = snapshot(backend[1], buffer.keys.prefix)
    for bad, match in cases:
        with pytest.raises(InvalidArgument, match=match):
            buffer.put_batch(BatchRef("job", 8, "bad"), bad, [bytes(24)])
    with pytest.raises(InvalidArgument, match=r"start.ttl_seconds = -1"):
        buffer.put_batch(BatchRef("job", 8, "bad"), header, [bytes(24)], ttl_seconds=-1)
    assert snapshot(backend[1], buffer.keys.prefix) == before


def test_concurrent_overwrites_leave_one_whole_batch(make_buffer):
    buffer = make_buffer(limits={"chunk_bytes": 64 * KiB}, batches={"overwrite_grace_seconds": 0})
    ref = BatchRef("job", 9, "hot")
    payloads = [np.full(300_000, i, dtype=np.uint8) for i in range(6)]
    threads = [threading.Thread(target=buffer.put_columns, args=(ref, {"v": p})) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = buffer.get_batch(ref)["v"]
    assert any(np.array_equal(got, p) for p in payloads)
    chunks = list(buffer.handle.client.scan_iter(match="{" + buffer.keys.batch_tag(ref) + "}:c:*"))
    assert len(chunks) == -(-300_000 // (64 * KiB)), "only the current generation's chunks remain"
    assert buffer.stats().used_entries == 1
