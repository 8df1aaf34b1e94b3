"""The data buffer service over real gRPC and a real Redis (the machine's Redis 7 under a unique
prefix, and an embedded redis-server): bit-exact round trips up to 1 GiB, bad input refused with
INVALID_ARGUMENT naming the field and nothing changed, the budget, 8 producers x 8 consumers
acking every group exactly once, a killed consumer's groups redelivered, two instances over one Redis."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import redis

from meshrl.api.common.v1 import keys_pb2, tensor_pb2
from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import NUMPY_BY_DTYPE, Batch, Ragged, encode_batch
from meshrl.common.databuffer_client import SERVICE, DataBufferClient, Group, serialize_put_request
from meshrl.common.errors import NotFound, ResourceExhausted
from tests._databuffer import (
    SYSTEM_REDIS,
    config,
    delete_prefix,
    run_producers_and_consumers,
    serving,
    snapshot,
    unique_prefix,
)

MiB = 1 << 20


@pytest.fixture(scope="module")
def system_redis():
    client = redis.Redis.from_url(SYSTEM_REDIS)
    client.ping()
    yield client
    client.close()


@pytest.fixture(params=["system", "embedded"])
def service(request, system_redis):
    """(client, buffer, raw redis client) of a service on the machine's Redis or on its own embedded one."""
    prefix = unique_prefix("svc")
    cfg = config(SYSTEM_REDIS if request.param == "system" else None, prefix, limits={"max_frame_bytes": 8 * MiB})
    with serving(cfg) as (buffer, running):
        client = DataBufferClient(running.address)
        client.wait_until_ready(10)
        yield client, buffer, buffer.handle.client
        client.close()
        if request.param == "system":
            delete_prefix(system_redis, prefix)


def _random_bytes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


@pytest.mark.parametrize("size", [1 * MiB, 64 * MiB + 13])
def test_round_trip_is_bit_exact(service, size):
    client, _, _ = service
    data = _random_bytes(size, size)
    key = batch_key("job", 1, "rollout", shard=0)
    assert client.put(key, {"payload": data}) == size
    got = client.get(key)["payload"]
    assert got.tobytes() == data.tobytes() and got.flags.writeable


def test_every_dtype_ragged_empty_and_metadata_round_trip(service):
    client, _, _ = service
    rng = np.random.default_rng(0)
    cols = {
        d.name: rng.integers(0, 256, size=(3, 5 * d.itemsize), dtype=np.uint8).view(d) for d in NUMPY_BY_DTYPE.values()
    }
    cols["tokens"] = Ragged.from_rows([[1, 2], [], [3, 4, 5]], dtype=np.int32)
    cols["none"] = np.zeros((3, 0), np.float32)
    samples = [tensor_pb2.SampleMeta(group_id="g", index_in_group=i, weight_version=2) for i in range(3)]
    client.put(batch_key("job", 2, "all"), Batch(cols, samples, {"k": "v"}))
    got = client.get(batch_key("job", 2, "all"))
    for name, col in cols.items():
        if isinstance(col, Ragged):
            assert (
                got[name].values.tobytes() == col.values.tobytes()
                and got[name].offsets.tolist() == col.offsets.tolist()
            )
        else:
            assert got[name].dtype == col.dtype and got[name].shape == col.shape
            assert got[name].tobytes() == col.tobytes()
    assert got.samples == samples and got.attrs == {"k": "v"}
    client.put(batch_key("job", 2, "zero"), {"x": np.zeros((0, 4), np.int64)})
    assert client.get(batch_key("job", 2, "zero"))["x"].shape == (0, 4)


def test_get_many_merges_upstream_batches_by_column(service):
    client, _, _ = service
    client.put(batch_key("job", 3, "reward"), {"rewards": np.arange(4, dtype=np.float32)})
    client.put(batch_key("job", 3, "adv"), {"advantages": Ragged.from_rows([[1.0]] * 4, dtype=np.float32)})
    merged = client.get_many([batch_key("job", 3, "reward"), batch_key("job", 3, "adv")])
    assert set(merged.columns) == {"rewards", "advantages"} and merged.num_rows() == 4
    assert [k.node_id for k in client.list("job", 3)] == ["adv", "reward"]
    assert client.delete_job("job") == (2, 0)
    with pytest.raises(NotFound):
        client.get(batch_key("job", 3, "reward"))


def test_get_many_concatenates_the_shards_of_one_node_in_shard_order(service):
    client, _, _ = service
    client.put(batch_key("job", 4, "rollout", shard=1), {"ids": np.array([2, 3])})
    client.put(batch_key("job", 4, "rollout", shard=0), {"ids": np.array([0, 1])})
    client.put(batch_key("job", 4, "reward"), {"rewards": np.arange(4, dtype=np.float32)})
    keys = [
        batch_key("job", 4, "rollout", shard=1),
        batch_key("job", 4, "reward"),
        batch_key("job", 4, "rollout", shard=0),
    ]
    merged = client.get_many(keys)
    assert merged["ids"].tolist() == [0, 1, 2, 3] and merged["rewards"].tolist() == [0, 1, 2, 3]


@pytest.mark.slow
def test_one_gib_round_trip_is_bit_exact(system_redis):
    prefix = unique_prefix("gib")
    with serving(config(SYSTEM_REDIS, prefix)) as (_, running):
        client = DataBufferClient(running.address)
        data = _random_bytes(1 << 30, 7)
        key = batch_key("job", 0, "huge")
        try:
            assert client.put(key, {"payload": data}, timeout=600) == 1 << 30
            got = client.get(key, timeout=600)["payload"]
            assert np.array_equal(got, data)
            del got
        finally:
            client.delete(key)
            client.close()
            delete_prefix(system_redis, prefix)


# --- bad input ------------------------------------------------------------------------------
def _raw_put(channel, messages, timeout=10):
    put = channel.stream_unary(
        f"/{SERVICE}/PutBatch",
        request_serializer=serialize_put_request,
        response_deserializer=pb.PutBatchResponse.FromString,
    )
    return put(iter(messages), timeout=timeout)


def _start(key, header):
    return pb.PutBatchRequest(start=pb.PutBatchStart(key=key, header=header))


def _unchecked_key(job_id: str, step: int, node_id: str, shard: int | None = None) -> keys_pb2.BatchKey:
    """A wire key the client would refuse to build (BatchRef checks it), to show the server refuses it too."""
    if shard is None:
        return keys_pb2.BatchKey(job_id=job_id, step=step, node_id=node_id, shard=-1)
    return keys_pb2.BatchKey(job_id=job_id, step=step, node_id=node_id, shard=shard, has_shard=True)


def test_bad_input_is_invalid_argument_naming_the_field_and_changes_nothing(service):
    client, buffer, raw = service
    client.put(batch_key("job", 0, "kept"), {"x": np.arange(6, dtype=np.float32)})
    client.append_groups("job", "s", [Group("g", 1, {"x": np.arange(2)})])
    before = snapshot(raw, buffer.keys.prefix)
    header, views = encode_batch({"x": np.zeros((2, 3), np.float32)})
    payload = bytes(views[0])

    def edited(**changes):
        h = tensor_pb2.BatchHeader.FromString(header.SerializeToString())
        for name, value in changes.items():
            setattr(h.tensors[0], name, value)
        return h

    bad_shape = tensor_pb2.BatchHeader.FromString(header.SerializeToString())
    bad_shape.tensors[0].shape[:] = [3, 3]
    key = batch_key("job", 0, "new")
    puts = [
        ([_start(key, edited(dtype=77)), payload], r"start.header.tensors\['x'\].dtype = 77"),
        ([_start(key, bad_shape), payload], r"start.header.tensors\['x'\].nbytes = 24 but shape \[3, 3\]"),
        ([_start(key, edited(nbytes=25)), payload], r"start.header.tensors\['x'\].nbytes = 25"),
        ([_start(key, header), payload[:10]], r"^payload: the stream ended after 10 of the 24 bytes"),
        ([_start(key, header), payload, b"+"], r"^payload: more bytes than start.header.total_bytes = 24"),
        ([_start(_unchecked_key("job!", 0, "n"), header), payload], r"^start.key.job_id = 'job!' is not a valid name"),
        ([_start(_unchecked_key("job", -5, "n"), header), payload], r"^start.key.step = -5"),
        ([payload], r"^start: the first PutBatch message must be `start`"),
        ([_start(key, header), payload, _start(key, header)], r"^start: a PutBatch stream carries one `start`"),
        ([_start(key, header), bytes(9 * MiB)], r"^payload: a frame of 9437184 bytes exceeds limits.max_frame_bytes"),
    ]
    channel = grpc.insecure_channel(client.address)
    for messages, match in puts:
        with pytest.raises(grpc.RpcError) as info:
            _raw_put(channel, messages)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert re.search(match, info.value.details()), info.value.details()

    raw_calls = [
        ("ListBatches", b"\x0a\x02\xc3\x28", r"^job_id is not valid UTF-8"),
        ("AppendGroups", b"\x0a\x03job\x12\x01s\x1a\x04\x0a\x02\xff\xff", r"^groups\[0\].group_id is not valid UTF-8"),
        ("GetBatch", b"\x0a\x05\x0a\x03\xe2\x82", r"^key.job_id is not valid UTF-8"),
        (
            "AckGroups",
            pb.AckGroupsRequest(job_id="job", stream="s", consumer_group="g", entry_ids=["x"]).SerializeToString(),
            r"^entry_ids\[0\]",
        ),
        (
            "GetBatch",
            pb.GetBatchRequest(key=_unchecked_key("job", 0, "n", shard=-3)).SerializeToString(),
            r"^key.shard = -3",
        ),
        (
            "ReadGroups",
            pb.ReadGroupsRequest(
                job_id="job", stream="s", consumer_group="g", consumer="c", max_groups=-1
            ).SerializeToString(),
            r"^max_groups = -1",
        ),
    ]
    for method, body, match in raw_calls:
        unary = channel.unary_unary(f"/{SERVICE}/{method}")
        with pytest.raises(grpc.RpcError) as info:
            result = unary(body, timeout=10)
            if method == "GetBatch":
                list(result)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, info.value.details())
        assert re.search(match, info.value.details()), info.value.details()

    too_big = Group("big", 1, {"x": np.zeros(40 * MiB, np.uint8)})
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(f"/{SERVICE}/AppendGroups")(
            pb.AppendGroupsRequest(job_id="job", stream="s", groups=[too_big.to_proto()]).SerializeToString(),
            timeout=30,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "groups[0] is" in info.value.details()
    channel.close()
    assert snapshot(raw, buffer.keys.prefix) == before


def test_budget_exceeded_is_resource_exhausted_with_the_budget(system_redis):
    prefix = unique_prefix("budget")
    with serving(config(SYSTEM_REDIS, prefix, budget={"max_bytes": 2 * MiB})) as (_, running):
        client = DataBufferClient(running.address)
        client.put(batch_key("job", 0, "a"), {"x": np.zeros(MiB + 1, np.uint8)})
        with pytest.raises(ResourceExhausted, match=r"budget.max_bytes = 2097152 bytes"):
            client.put(batch_key("job", 0, "b"), {"x": np.zeros(MiB, np.uint8)})
        assert client.stats().budget_bytes == 2 * MiB
        client.close()
    delete_prefix(system_redis, prefix)


# --- streams under concurrency and failure -------------------------------------------------------
def _run_producers_and_consumers(addresses: list[str], **sizes) -> None:
    expected, acks, deliveries, errors = run_producers_and_consumers(addresses, **sizes)
    assert not errors, errors
    assert set(acks) == expected and set(acks.values()) == {1}, "every group acked exactly once"
    assert set(deliveries.values()) == {1}, "no group delivered twice in a run where no consumer died"


def test_eight_producers_and_eight_consumers_ack_every_group_exactly_once(service):
    client, _, _ = service
    _run_producers_and_consumers([client.address])
    stats = client.stats("job")
    assert [(s.length, s.pending, s.lag) for s in stats.streams] == [(0, 0, 0)]


CONSUMER = """
import sys, time
from meshrl.common.databuffer_client import DataBufferClient
client = DataBufferClient(sys.argv[1])
result = client.read_groups("job", "s", "train", "doomed", max_groups=3)
print(" ".join(g.entry_id for g in result.groups), flush=True)
time.sleep(300)
"""


def test_a_killed_consumers_groups_are_redelivered_to_another(service):
    client, _, _ = service
    ids = client.append_groups("job", "s", [Group(f"g{i}", 1, {"x": np.arange(3)}) for i in range(5)])
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, client.address], stdout=subprocess.PIPE, text=True)
    try:
        taken = proc.stdout.readline().split()
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
    assert taken == ids[:3]
    first = client.read_groups("job", "s", "train", "heir", max_groups=5, claim_idle_seconds=0.5)
    assert [g.entry_id for g in first.groups] == ids[3:]
    assert client.ack("job", "s", "train", ids[3:]) == 2
    time.sleep(0.6)
    second = client.read_groups("job", "s", "train", "heir", max_groups=5, claim_idle_seconds=0.5)
    assert [(g.entry_id, g.delivery_count) for g in second.groups] == [(i, 2) for i in taken]
    assert client.ack("job", "s", "train", taken) == 3
    assert client.stats("job").streams[0].pending == 0


def test_two_instances_over_one_redis_share_batches_wakeups_and_groups(system_redis):
    prefix = unique_prefix("two")
    cfg = config(SYSTEM_REDIS, prefix, batches={"poll_seconds": 5.0})
    with serving(cfg) as (_, a), serving(cfg) as (_, b):
        ca, cb = DataBufferClient(a.address), DataBufferClient(b.address)
        ca.put(batch_key("job", 0, "n"), {"x": np.arange(10)})
        assert np.array_equal(cb.get(batch_key("job", 0, "n"))["x"], np.arange(10))
        timer = threading.Timer(0.3, ca.put, args=(batch_key("job", 1, "n"), {"x": np.arange(3)}))
        start = time.monotonic()
        timer.start()
        assert np.array_equal(cb.get(batch_key("job", 1, "n"), wait_seconds=10)["x"], np.arange(3))
        assert time.monotonic() - start < 2.5, "instance A's commit woke the get waiting on instance B"
        _run_producers_and_consumers([a.address, b.address], producers=4, consumers=4, per_producer=12)
        shared = [dataclasses.replace(c.stats("job"), get_calls=0, get_bytes=0, get_rows=0) for c in (ca, cb)]
        assert shared[0] == shared[1]  # what Redis holds; the read counters are each process's own
        ca.close()
        cb.close()
    delete_prefix(system_redis, prefix)
