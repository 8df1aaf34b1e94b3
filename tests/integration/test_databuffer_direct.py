"""The direct data path over real gRPC and the machine's Redis: the client stages and reads payload chunks in
Redis itself while the service checks and commits; selections read only their bytes; every bad commit (a
chunk missing or of the wrong size, a bad generation or chunk count, over the budget, the committed
generation reused) is refused with a clear error, keeps the batch that was there and leaves no staged chunk;
a batch deleted mid-read is NOT_FOUND; an unreachable Redis falls back to the relayed path (or is UNAVAILABLE
with fallback off)."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged, encode_batch
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.common.direct_path import DirectPathConfig
from meshrl.common.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from meshrl.common.grpc_channel import call
from meshrl.common.net import free_port
from tests._databuffer import SYSTEM_REDIS, config, delete_prefix, direct_and_relayed, unique_prefix

KiB = 1 << 10
CHUNK = 64 * KiB
ROWS = 300


@pytest.fixture(scope="module")
def buffer():
    """(direct client, relayed client, raw redis, prefix) on a service with 64 KiB chunks and a 4 MiB budget."""
    raw = redis.Redis.from_url(SYSTEM_REDIS)
    prefix = unique_prefix("direct")
    cfg = config(SYSTEM_REDIS, prefix, limits={"chunk_bytes": CHUNK}, budget={"max_bytes": 4 << 20})
    with direct_and_relayed(cfg, SYSTEM_REDIS) as (_, direct, relayed):  # every batch direct
        yield direct, relayed, raw, prefix
    delete_prefix(raw, prefix)
    raw.close()


def snapshot(raw, prefix):
    """Every key under `prefix` with its value (hashes as dicts: DUMP's field order changes as Redis rehashes)."""
    out = {}
    for key in raw.scan_iter(match="{" + prefix + ":*", count=1000):
        out[key] = raw.hgetall(key) if raw.type(key) == b"hash" else raw.dump(key)
    return out


def _columns():
    rng = np.random.default_rng(3)
    tokens = Ragged.from_rows([rng.integers(0, 1000, size=n, dtype=np.int32) for n in rng.integers(0, 60, ROWS)])
    return {"prompt_ids": tokens, "dense": rng.standard_normal((ROWS, 96)).astype(np.float32)}  # ~150 KiB


def _same(a, b) -> None:
    assert list(a.columns) == list(b.columns)
    for name in a.columns:
        x, y = a[name], b[name]
        if isinstance(x, Ragged):
            assert np.array_equal(x.offsets, y.offsets) and np.array_equal(x.values, y.values)
        else:
            assert np.array_equal(x, y)


def test_direct_and_relayed_paths_store_and_read_the_same_batch(buffer):
    direct, relayed, _, _ = buffer
    assert direct.direct_path() is not None and relayed.direct_path() is None
    cols = _columns()
    for i, (writer, reader) in enumerate([(direct, relayed), (relayed, direct), (direct, direct)]):
        key = batch_key("dj", i, "data_load")
        writer.put(key, cols)
        got = reader.get(key)
        _same(got, relayed.get(key))
        assert np.array_equal(got["dense"], cols["dense"])
        got["dense"][0, 0] = 1.0  # writable, as the relayed path's arrays
    small = batch_key("dj", 9, "reward")
    direct.put(small, {"rewards": np.arange(5, dtype=np.float32)})  # one chunk
    assert relayed.get(small)["rewards"].tolist() == [0, 1, 2, 3, 4]


def test_under_min_bytes_a_batch_goes_through_the_service_and_comes_back_inline(buffer):
    _, relayed, raw, prefix = buffer
    key = batch_key("dj", 10, "reward")
    small = {"rewards": np.arange(1000, dtype=np.float32)}  # 4 KB
    path = DirectPathConfig(redis_url=SYSTEM_REDIS, fallback=False, min_bytes=8 << 10)
    with DataBufferClient(relayed.address, direct=path) as client:
        client.put(key, small)
        request = pb.GetBatchRequest(key=key, inline_below=8 << 10)
        located = call(client._stub.LocateBatch, request, timeout=30)
        assert located.inline and not located.ranges and len(located.payload) == 4000
        assert client.get(key)["rewards"].tolist() == small["rewards"].tolist()
        assert client.get(key, rows=(10, 13))["rewards"].tolist() == [10, 11, 12]
        request.inline_below = 4000  # not fewer bytes than that: ranges to read
        assert not call(client._stub.LocateBatch, request, timeout=30).inline


def test_a_direct_selection_reads_only_its_rows_and_columns(buffer):
    direct, relayed, _, _ = buffer
    key = batch_key("dj", 20, "data_load")
    relayed.put(key, _columns())
    before = relayed.stats()
    got = direct.get(key, columns=["prompt_ids"], rows=(40, 260))  # spans chunk boundaries
    after = relayed.stats()
    _same(got, relayed.get(key, columns=["prompt_ids"], rows=(40, 260)))
    assert after.get_bytes - before.get_bytes == got["prompt_ids"].values.nbytes  # counted by the service
    with pytest.raises(NotFound, match="has no column"):
        direct.get(key, columns=["nope"])
    with pytest.raises(InvalidArgument, match="rows = "):
        direct.get(key, rows=(0, ROWS + 1))


def _stage(client, key, payload: bytes, sizes=None) -> tuple[str, list[str]]:
    """Stages `payload` as the client would (or cut at `sizes`); returns the generation and chunk keys."""
    path = client.direct_path()
    gen = "0123456789abcdef"
    sizes = sizes or [min(CHUNK, len(payload) - i) for i in range(0, len(payload), CHUNK)]
    keys, pos = [], 0
    for i, n in enumerate(sizes):
        keys.append(path.chunk_key(key, gen, i))
        path.client.set(keys[-1], payload[pos : pos + n], px=60_000)
        pos += n
    return gen, keys


def _commit(client, key, columns, gen, chunks):
    header, _ = encode_batch(columns)
    request = pb.CommitDirectPutRequest(
        start=pb.PutBatchStart(key=key, header=header, overwrite=True), generation=gen, chunks=chunks
    )
    return call(client._stub.CommitDirectPut, request, timeout=30)


@pytest.mark.parametrize(
    ("case", "error", "says"),
    [
        ("missing", InvalidArgument, "was not staged"),
        ("short", InvalidArgument, "holds 1000 bytes, expected"),
        ("count", InvalidArgument, "chunks = 2, but"),
        ("generation", InvalidArgument, "must be 16 lowercase hex digits"),
        ("budget", ResourceExhausted, "budget exceeded"),
    ],
)
def test_a_bad_direct_commit_is_refused_keeps_the_old_batch_and_leaves_no_staged_chunk(buffer, case, error, says):
    direct, relayed, raw, prefix = buffer
    key = batch_key("dj", 30, "data_load")
    relayed.put(key, {"x": np.arange(10)})
    before = snapshot(raw, prefix)
    x = np.arange(40_000, dtype=np.int64) if case != "budget" else np.zeros(5 << 20, np.uint8)  # 320 KiB: 5 chunks
    payload = x.tobytes()
    if case == "missing":
        gen, keys = _stage(direct, key, payload)
        raw.delete(keys[2])
        chunks = len(keys)
    elif case == "short":
        gen, keys = _stage(direct, key, payload, sizes=[CHUNK, CHUNK, 1000])
        chunks = 5
        for i in (3, 4):
            raw.set(direct.direct_path().chunk_key(key, gen, i), b"x" * CHUNK, px=60_000)
    elif case == "budget":
        gen, keys = _stage(direct, key, payload)
        chunks = len(keys)
    else:
        gen, keys = _stage(direct, key, payload)
        chunks = 2 if case == "count" else len(keys)
        gen = gen if case == "count" else "NOT-HEX"
    with pytest.raises(error, match=says):
        _commit(direct, key, {"x": x}, gen, chunks)
    if case == "generation":  # nothing it could name was touched; the client's own chunks expire on their TTL
        raw.delete(*keys)
    assert snapshot(raw, prefix) == before
    assert relayed.get(key)["x"].tolist() == list(range(10))


def test_a_direct_commit_that_reuses_the_committed_generation_is_refused_and_keeps_the_batch(buffer):
    direct, relayed, raw, prefix = buffer
    key = batch_key("dj", 31, "data_load")
    x = np.arange(100, dtype=np.int64)
    gen, _ = _stage(direct, key, x.tobytes())
    _commit(direct, key, {"x": x}, gen, 1)
    before = snapshot(raw, prefix)
    with pytest.raises(InvalidArgument, match="already counted; use a fresh random generation"):
        _commit(direct, key, {"x": x}, gen, 1)
    assert snapshot(raw, prefix) == before and relayed.get(key)["x"].tolist() == x.tolist()


def test_a_batch_deleted_while_a_direct_get_reads_it_is_not_found(buffer):
    direct, relayed, _, _ = buffer
    key = batch_key("dj", 40, "data_load")
    relayed.put(key, _columns())
    located = call(direct._stub.LocateBatch, pb.GetBatchRequest(key=key), timeout=30)
    assert len(located.ranges) > 1 and all(r.whole for r in located.ranges)
    relayed.delete(key)
    with pytest.raises(NotFound, match="deleted or replaced while it was being read"):
        direct.direct_path().read(located)


def test_an_unreachable_redis_falls_back_to_the_relayed_path_or_is_unavailable(buffer):
    _, relayed, _, _ = buffer
    dead = f"redis://127.0.0.1:{free_port()}/0"
    key = batch_key("dj", 50, "reward")
    with DataBufferClient(relayed.address, direct=DirectPathConfig(redis_url=dead, min_bytes=0)) as client:
        client.put(key, {"r": np.ones(3, np.float32)})
        assert client.get(key)["r"].tolist() == [1, 1, 1] and client.direct_path() is None
    with DataBufferClient(
        relayed.address, direct=DirectPathConfig(redis_url=dead, fallback=False, min_bytes=0)
    ) as client:
        with pytest.raises(Unavailable, match="unreachable"):
            client.put(key, {"r": np.ones(3, np.float32)})


def test_a_bad_direct_path_config_names_the_field():
    with pytest.raises(ValueError, match="scheme 'http' is not one of"):
        DirectPathConfig(redis_url="http://127.0.0.1:6379")
