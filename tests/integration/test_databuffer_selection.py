"""GetBatch of some columns and some rows, over real gRPC and the machine's Redis: only the asked bytes
leave the buffer (counted on the buffer side), ragged columns are cut at their offsets across chunk
boundaries, bad columns / ranges are refused with NOT_FOUND / INVALID_ARGUMENT and change nothing; one
call deletes a step; small batches go in one unary PutSmallBatch."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import redis

from meshrl.api.common.v1 import tensor_pb2
from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged, encode_batch
from meshrl.common.databuffer_client import SERVICE, DataBufferClient, encode_small_put
from meshrl.common.errors import InvalidArgument, NotFound
from tests._databuffer import SYSTEM_REDIS, config, delete_prefix, serving, unique_prefix

KiB = 1 << 10
ROWS = 300


@pytest.fixture(scope="module")
def buffer():
    """(client, DataBuffer, raw redis, prefix) with 64 KiB chunks, so a column spans several chunks."""
    raw = redis.Redis.from_url(SYSTEM_REDIS)
    prefix = unique_prefix("sel")
    cfg = config(SYSTEM_REDIS, prefix, limits={"chunk_bytes": 64 * KiB, "max_frame_bytes": 256 * KiB})
    with serving(cfg) as (store, running):
        client = DataBufferClient(running.address, frame_bytes=16 * KiB)  # > 16 KiB: streamed puts
        client.wait_until_ready(10)
        yield client, store, raw, prefix
        client.close()
    delete_prefix(raw, prefix)
    raw.close()


def _columns():
    rng = np.random.default_rng(1)
    lengths = rng.integers(0, 40, size=ROWS)
    tokens = Ragged.from_rows([rng.integers(0, 1000, size=n, dtype=np.int32) for n in lengths], dtype=np.int32)
    return {
        "prompt_ids": tokens,
        "dense": rng.standard_normal((ROWS, 96)).astype(np.float32),  # 384 bytes a row
        "index": np.arange(ROWS, dtype=np.int64),
    }


def _contents(raw, prefix):
    """Every key under `prefix` with its value (hashes as dicts: DUMP's field order changes as Redis rehashes)."""
    out = {}
    for key in raw.scan_iter(match="{" + prefix + ":*", count=1000):
        kind = raw.type(key)
        out[key] = raw.hgetall(key) if kind == b"hash" else raw.dump(key)
    return out


def _samples():
    return [tensor_pb2.SampleMeta(group_id=f"g{i}", index_in_group=i) for i in range(ROWS)]


def test_columns_and_rows_send_only_their_bytes(buffer):
    client, store, _, _ = buffer
    key = batch_key("job", 1, "data_load")
    cols = _columns()
    client.put(key, cols, samples=_samples())
    before = client.stats()
    got = client.get(key, columns=["dense", "prompt_ids"], rows=(37, 211))
    after = client.stats()
    assert list(got.columns) == ["dense", "prompt_ids"]
    assert np.array_equal(got["dense"], cols["dense"][37:211])
    want = cols["prompt_ids"].rows()[37:211]
    assert got["prompt_ids"].offsets[0] == 0 and len(got["prompt_ids"]) == 174
    assert all(np.array_equal(a, b) for a, b in zip(got["prompt_ids"].rows(), want))
    assert [s.group_id for s in got.samples] == [f"g{i}" for i in range(37, 211)]
    needed = cols["dense"][37:211].nbytes + sum(r.nbytes for r in want)
    assert after.get_calls - before.get_calls == 1
    assert after.get_bytes - before.get_bytes == needed  # counted by the buffer: nothing else was sent
    assert after.get_rows - before.get_rows == 174
    whole = client.get(key)  # no selection: every column and row, as before
    assert set(whole.columns) == set(cols) and whole.num_rows() == ROWS
    empty = client.get(key, columns=["index"], rows=(5, 5))
    assert empty.num_rows() == 0 and empty["index"].dtype == np.int64


def test_replicas_reading_row_ranges_read_the_batch_once(buffer):
    """Three readers of disjoint ranges (as rollout replicas do) together read each byte of their columns once."""
    client, _, _, _ = buffer
    key = batch_key("job", 2, "data_load")
    cols = _columns()
    client.put(key, cols)
    before = client.stats()
    parts = [client.get(key, columns=["prompt_ids"], rows=r) for r in ((0, 100), (100, 250), (250, ROWS))]
    after = client.stats()
    assert after.get_bytes - before.get_bytes == cols["prompt_ids"].values.nbytes
    assert after.get_rows - before.get_rows == ROWS
    rows = [row for p in parts for row in p["prompt_ids"].rows()]
    assert all(np.array_equal(a, b) for a, b in zip(rows, cols["prompt_ids"].rows()))


@pytest.mark.parametrize(
    ("selection", "error", "says"),
    [
        ({"columns": ["nope"]}, NotFound, "has no column ['nope']"),
        ({"columns": ["dense", "dense"]}, InvalidArgument, "names a column twice"),
        ({"rows": (10, ROWS + 1)}, InvalidArgument, f"which has {ROWS} rows"),
        ({"rows": (20, 10)}, InvalidArgument, "rows = [20, 10)"),
        ({"rows": (-1, 3)}, InvalidArgument, "rows = [-1, 3)"),
    ],
)
def test_bad_columns_or_rows_are_refused_and_change_nothing(buffer, selection, error, says):
    client, _, raw, prefix = buffer
    key = batch_key("job", 3, "data_load")
    client.put(key, _columns())
    before, stats = _contents(raw, prefix), client.stats()
    with pytest.raises(error) as info:
        client.get(key, **selection)
    assert says in str(info.value)
    assert _contents(raw, prefix) == before and client.stats().get_calls == stats.get_calls


def test_get_many_takes_each_column_from_the_batch_that_holds_it(buffer):
    client, _, _, _ = buffer
    a, b = batch_key("job", 4, "rollout"), batch_key("job", 4, "reward")
    client.put(a, {"response_ids": Ragged.from_rows([[1, 2], [3]], dtype=np.int32), "group_index": np.arange(2)})
    client.put(b, {"rewards": np.ones(2, np.float32), "accuracy": np.ones(2, np.float32)})
    got = client.get_many([a, b], columns=["rewards", "response_ids"])
    assert sorted(got.columns) == ["response_ids", "rewards"]
    with pytest.raises(NotFound, match="holds column \\['values'\\]"):
        client.get_many([a, b], columns=["rewards", "values"])


def test_delete_step_removes_every_batch_of_that_step_only(buffer):
    client, _, _, _ = buffer
    for node in ("data_load", "rollout", "reward"):
        client.put(batch_key("delstep", 7, node), {"x": np.arange(4)})
    client.put(batch_key("delstep", 8, "data_load"), {"x": np.arange(4)})
    held = client.stats("delstep").bytes
    assert client.delete_step("delstep", 7) == (3, held)  # and what stats said before: one call at a step's end
    assert client.list("delstep", 7) == [] and len(client.list("delstep", 8)) == 1
    assert client.stats("delstep").bytes == 32
    assert client.delete_step("delstep", 7) == (0, 32)
    with pytest.raises(InvalidArgument, match="step = -1"):
        client.delete_step("delstep", -1)


def test_a_small_batch_is_one_unary_put(buffer):
    client, _, _, _ = buffer
    key = batch_key("job", 9, "reward")
    small = {"rewards": np.arange(100, dtype=np.float32)}  # 400 bytes: under the client's 16 KiB frames
    assert client.put(key, small) == 400
    assert np.array_equal(client.get(key)["rewards"], small["rewards"])
    client.put(key, {"rewards": np.zeros(3, np.float32)}, overwrite=True)  # overwrite keeps atomic semantics
    assert client.get(key)["rewards"].tolist() == [0, 0, 0]


def test_put_small_batch_in_any_field_order_and_over_the_frame_limit(buffer):
    """The service reads the client's layout without a copy, a message in another field order through protobuf,
    and refuses a payload over limits.max_frame_bytes with INVALID_ARGUMENT, storing nothing."""
    client, _, raw, prefix = buffer
    stub = client._channel.unary_unary(
        f"/{SERVICE}/PutSmallBatch", request_serializer=bytes, response_deserializer=pb.PutBatchResponse.FromString
    )
    key = batch_key("job", 10, "reward")
    header, views = encode_batch({"rewards": np.arange(8, dtype=np.float32)})
    start = pb.PutBatchStart(key=key, header=header, overwrite=True)
    reordered = (
        pb.PutSmallBatchRequest(payload=bytes(views[0])).SerializeToString()
        + pb.PutSmallBatchRequest(start=start).SerializeToString()
    )
    assert stub(reordered, timeout=30).bytes_written == 32
    assert client.get(key)["rewards"].tolist() == list(range(8))
    big = np.zeros(300 * KiB, np.uint8)
    header, views = encode_batch({"x": big})
    start = pb.PutBatchStart(key=batch_key("job", 10, "big"), header=header)
    before = _contents(raw, prefix)
    with pytest.raises(grpc.RpcError) as info:
        stub(encode_small_put(start, views), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "limits.max_frame_bytes" in info.value.details()
    assert _contents(raw, prefix) == before


def test_several_small_gets_go_in_one_call_and_a_batch_past_its_limit_is_not_read(buffer):
    client, _, _, _ = buffer
    keys = [batch_key("job", 11, n) for n in ("a", "b", "c")]
    for i, key in enumerate(keys):  # 1000 rows each, of 1000, 2000, 3000 bytes
        client.put(key, {f"x{i}": np.full((1000, i + 1), i, dtype=np.uint8)})
    gets = [pb.GetBatchRequest(key=k) for k in keys]
    before = client.stats()
    reply = client._stub.GetSmallBatches(pb.GetSmallBatchesRequest(gets=gets, limit_bytes=3500), timeout=30)
    assert [b.too_large for b in reply.batches] == [False, False, True]  # 1000 + 2000 fit, 3000 more do not
    assert [len(b.payload) for b in reply.batches] == [1000, 2000, 0]
    assert client.stats().get_bytes - before.get_bytes == 3000  # the third was not read
    calls = []
    real = client._stub.GetSmallBatches
    client._stub.GetSmallBatches = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        got = client.get_many(keys)  # the client's frames are 16 KiB: all three in the one call
    finally:
        client._stub.GetSmallBatches = real
    assert calls == [1] and sorted(got.columns) == ["x0", "x1", "x2"] and got["x2"][0].tolist() == [2, 2, 2]
    with pytest.raises(grpc.RpcError) as info:
        client._stub.GetSmallBatches(pb.GetSmallBatchesRequest(gets=gets, limit_bytes=-1), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit_bytes = -1" in info.value.details()
