"""The zero-RPC direct path over a real gRPC service and the machine's Redis: a whole-batch put of one value and
a whole-batch get make no RPC (the client's channel is closed and they still work), run the service's own
scripts, and keep every rule of a relayed put: budget refusal and overwrite=False refusal leave nothing behind,
an overwrite keeps the old generation's grace period and ledger entry, a waiting get is woken by the commit
notification, GetStats counts the gets, a Redis that lost its scripts (SCRIPT FLUSH) is recovered, and the
relayed path reads what the zero-RPC path wrote (whole, columns, rows)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import redis

from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.batch_key import batch_key
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.common.direct_path import DirectPathConfig
from meshrl.common.errors import AlreadyExists, InvalidArgument, ResourceExhausted
from meshrl.common.grpc_channel import call
from meshrl.common.zero_rpc import fill
from meshrl.databuffer.embedded import EmbeddedRedis
from tests._databuffer import SYSTEM_REDIS, config, delete_prefix, direct_and_relayed, serving, unique_prefix

KiB, MiB = 1 << 10, 1 << 20
BUDGET = 3 * MiB // 2


@pytest.fixture(scope="module")
def buffer():
    """(zero-RPC client, relayed client, raw redis, prefix, DataBuffer): 1 MiB chunks, a 1.5 MiB budget, and
    waiting gets that poll only every 5 s (so a prompt wake-up is the commit notification)."""
    raw = redis.Redis.from_url(SYSTEM_REDIS)
    prefix = unique_prefix("zero")
    cfg = config(
        SYSTEM_REDIS, prefix, limits={"chunk_bytes": MiB}, budget={"max_bytes": BUDGET}, batches={"poll_seconds": 5.0}
    )
    with direct_and_relayed(cfg, SYSTEM_REDIS) as (core, direct, relayed):  # every whole put zero-RPC
        assert direct.direct_path().zero is not None
        yield direct, relayed, raw, prefix, core
    delete_prefix(raw, prefix)
    raw.close()


def snapshot(raw, prefix):
    """Every key under `prefix` with its value (hashes as dicts) and whether it has a TTL."""
    out = {}
    for key in raw.scan_iter(match="{" + prefix + ":*", count=1000):
        value = raw.hgetall(key) if raw.type(key) == b"hash" else raw.dump(key)
        out[key] = (value, raw.pttl(key) > 0)
    return out


def _cols(n_bytes: int, seed: int = 0):
    rows = n_bytes // (4 * 8)
    return {"x": np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)}


def _offline(client: DataBufferClient) -> DataBufferClient:
    """A client that can make no RPC: its direct path is set up, then its channel is closed."""
    client.direct_path()
    client._channel.close()
    return client


def test_a_whole_batch_put_and_get_make_no_rpc_and_the_relayed_path_reads_it(buffer):
    _, relayed, raw, prefix, _ = buffer
    key = batch_key("zj", 1, "rollout")
    cols = _cols(MiB - 4 * KiB)
    with _offline(DataBufferClient(relayed.address, direct=DirectPathConfig(redis_url=SYSTEM_REDIS))) as client:
        assert client.put(key, cols) == cols["x"].nbytes
        got = client.get(key)
        assert np.array_equal(got["x"], cols["x"])
        got["x"][0, 0] = 1.0  # writable, as the other paths' arrays
    manifest = raw.hgetall("{" + prefix + ":b:zj:1:rollout:-}:m")
    assert manifest[b"v"] == b"1" and manifest[b"n"] == b"1" and manifest[b"r"] == str(len(cols["x"])).encode()
    tag = "{" + prefix + ":b:zj:1:rollout:-}"
    assert raw.strlen(tag + ":v") == cols["x"].nbytes and 0 < raw.pttl(tag + ":m") < raw.pttl(tag + ":v")
    assert not list(raw.scan_iter(match=tag + ":s:*"))  # the staged value was renamed
    assert np.array_equal(relayed.get(key)["x"], cols["x"])  # GetBatch of a payload under the value key
    assert np.array_equal(relayed.get(key, rows=(5, 9), columns=["x"])["x"], cols["x"][5:9])
    located = call(relayed._stub.LocateBatch, pb.GetBatchRequest(key=key, inline_below=0), timeout=30)
    assert located.inline and len(located.payload) == cols["x"].nbytes  # no chunk to point at: inline
    assert relayed.list("zj") == [key]
    assert relayed.delete(key) and raw.hget("{" + prefix + ":ledger}:tot", "bytes") is None  # budget released
    assert not raw.exists(tag + ":v")


def test_a_whole_batch_get_of_a_chunked_batch_reads_its_chunks_with_no_rpc(buffer):
    direct, relayed, _, _, _ = buffer
    key = batch_key("zj", 2, "rollout")
    cols = _cols(MiB + 300 * KiB, seed=2)  # two chunks, put through the service
    relayed.put(key, cols)
    with _offline(DataBufferClient(relayed.address, direct=DirectPathConfig(redis_url=SYSTEM_REDIS))) as client:
        assert np.array_equal(client.get(key)["x"], cols["x"])
    relayed.delete(key)


def test_over_the_budget_a_zero_rpc_put_is_refused_and_leaves_nothing_behind(buffer):
    direct, relayed, raw, prefix, _ = buffer
    held = batch_key("zj", 3, "held")
    direct.put(held, _cols(MiB - 4 * KiB))
    before = snapshot(raw, prefix)
    with pytest.raises(ResourceExhausted, match=r"budget exceeded: batch zj/step 3/more needs \d+ bytes in 1 entries"):
        direct.put(batch_key("zj", 3, "more"), _cols(600 * KiB))
    assert snapshot(raw, prefix) == before
    relayed.delete(held)


def test_overwrite_false_is_refused_and_keeps_the_batch_while_an_overwrite_keeps_a_grace_period(buffer):
    direct, relayed, raw, prefix, _ = buffer
    key = batch_key("zj", 4, "reward")
    relayed.put(key, {"r": np.arange(300_000, dtype=np.int32)})  # two chunks, through the service
    first = raw.hgetall("{" + prefix + ":b:zj:4:reward:-}:m")
    direct.put(key, {"r": np.arange(10, dtype=np.int32)})  # the zero-RPC put replaces it
    manifest = raw.hgetall("{" + prefix + ":b:zj:4:reward:-}:m")
    assert manifest[b"pg"] == first[b"gen"] and manifest[b"pn"] == b"2"
    old_chunk = "{" + prefix + ":b:zj:4:reward:-}:c:" + first[b"gen"].decode() + ":0"
    assert 0 < raw.pttl(old_chunk) <= 60_000  # readable for gets in flight, for the grace period
    assert raw.zscore("{" + prefix + ":ledger}:exp", "b:" + prefix + ":b:zj:4:reward:-:" + first[b"gen"].decode())
    before = snapshot(raw, prefix)
    with pytest.raises(AlreadyExists, match="already exists; put with overwrite=True"):
        direct.put(key, {"r": np.zeros(3, np.int32)}, overwrite=False)
    assert snapshot(raw, prefix) == before and direct.get(key)["r"].tolist() == list(range(10))
    relayed.delete(key)
    assert not raw.exists(old_chunk) and not raw.exists("{" + prefix + ":b:zj:4:reward:-}:v")
    other = batch_key("zj", 4, "other")
    direct.put(other, {"r": np.arange(5, dtype=np.int32)})
    relayed.put(other, {"r": np.arange(3, dtype=np.int32)})  # a relayed put over it drops its value key
    assert not raw.exists("{" + prefix + ":b:zj:4:other:-}:v") and direct.get(other)["r"].tolist() == [0, 1, 2]
    relayed.delete(other)


def test_a_bad_header_or_ttl_is_refused_before_anything_is_written_as_the_relayed_path_refuses_it(buffer):
    direct, relayed, raw, prefix, _ = buffer
    key = batch_key("zj", 5, "reward")
    before = snapshot(raw, prefix)
    messages = []
    for client in (direct, relayed):
        with pytest.raises(InvalidArgument, match=r"start.ttl_seconds = -1 must be in \[0, 2592000\]") as info:
            client.put(key, {"r": np.ones(3, np.float32)}, ttl_seconds=-1)
        messages.append(info.value.message)
    assert messages[0] == messages[1] and snapshot(raw, prefix) == before


def test_a_redis_that_lost_the_scripts_is_recovered_by_describing_the_path_again(tmp_path):
    own = EmbeddedRedis(str(tmp_path / "redis")).start()  # SCRIPT FLUSH on a Redis of its own, not the shared one
    try:
        with serving(config(own.url, unique_prefix("noscript"))) as (_, running):
            path = DirectPathConfig(redis_url=own.url, fallback=False, min_bytes=0)
            with DataBufferClient(running.address, direct=path) as client, own._client(10) as raw:
                key = batch_key("zj", 6, "reward")
                client.direct_path()
                raw.script_flush()
                client.put(key, {"r": np.arange(7, dtype=np.float32)})
                assert raw.hget(fill(client.direct_path().zero.layout.manifest_key_template, key), "v")  # zero-RPC
                raw.script_flush()
                before = client.stats().get_calls
                assert client.get(key)["r"].tolist() == list(range(7))
                assert client.stats().get_calls == before + 1  # the count script ran once it was loaded again
    finally:
        own.stop()


def test_a_waiting_get_is_woken_by_a_zero_rpc_put(buffer):
    direct, relayed, _, _, _ = buffer
    key = batch_key("zj", 7, "reward")
    got: dict[str, object] = {}

    def wait() -> None:
        t0 = time.monotonic()
        got["batch"] = relayed.get(key, wait_seconds=20)
        got["waited"] = time.monotonic() - t0

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)  # the get is waiting; it polls only every 5 s
    direct.put(key, {"r": np.arange(4, dtype=np.float32)})
    waiter.join(20)
    assert got["batch"]["r"].tolist() == [0, 1, 2, 3] and got["waited"] < 3.0
    got.clear()
    other = batch_key("zj", 7, "late")
    waiter = threading.Thread(target=lambda: got.update(batch=direct.get(other, wait_seconds=20)))
    waiter.start()  # a zero-RPC get of a batch not there yet waits through the service
    time.sleep(0.5)
    relayed.put(other, {"r": np.ones(2, np.float32)})
    waiter.join(20)
    assert got["batch"]["r"].tolist() == [1, 1]
    relayed.delete(key)
    relayed.delete(other)


def test_stats_count_zero_rpc_puts_and_gets(buffer):
    direct, relayed, _, _, _ = buffer
    key = batch_key("zstats", 8, "rollout")
    cols = _cols(64 * KiB)
    before = relayed.stats()
    direct.put(key, cols)
    for _ in range(3):
        direct.get(key)
    after = relayed.stats()
    assert after.get_calls - before.get_calls == 3
    assert after.get_bytes - before.get_bytes == 3 * cols["x"].nbytes
    assert after.get_rows - before.get_rows == 3 * len(cols["x"])
    mine = relayed.stats("zstats")
    assert mine.batches == 1 and mine.bytes == cols["x"].nbytes
    relayed.delete(key)
