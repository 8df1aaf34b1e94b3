"""The data buffer over a three-node Redis Cluster that the test starts on loopback ports
(/usr/bin/redis-server in cluster mode): round trips, waiting gets, listing and deletion, and
the consumer-group tests, through two service instances. Each batch's keys share one slot."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import redis
from redis.cluster import key_slot

from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.batch_key import batch_key
from meshrl.common.databuffer_client import DataBufferClient, Group
from meshrl.common.grpc_channel import call
from tests._databuffer import LocalCluster, config, run_producers_and_consumers, serving, unique_prefix

MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster() as c:
        yield c


@pytest.fixture(scope="module")
def services(cluster):
    cfg = config(
        cluster.url, unique_prefix("cluster"), cluster=True, limits={"chunk_bytes": MiB}, batches={"poll_seconds": 5.0}
    )
    with serving(cfg) as (buffer_a, a), serving(cfg) as (_, b):
        clients = DataBufferClient(a.address), DataBufferClient(b.address)
        yield buffer_a, clients
        for c in clients:
            c.close()


def test_the_cluster_spreads_batches_while_each_batch_stays_on_one_slot(cluster, services):
    buffer, (client, _) = services
    for step in range(6):
        client.put(batch_key("spread", step, "n"), {"x": np.zeros(3 * MiB + step, np.uint8)})
    nodes_holding = 0
    for port in cluster.ports:
        node = redis.Redis(port=port)
        keys = list(node.scan_iter(match="{" + buffer.keys.prefix + ":b:spread:*"))
        nodes_holding += bool(keys)
        by_batch: dict[bytes, set[int]] = {}
        for key in keys:
            by_batch.setdefault(key.split(b"}")[0], set()).add(key_slot(key))
        assert all(len(slots) == 1 for slots in by_batch.values())
        node.close()
    assert nodes_holding >= 2, "six batches over three nodes: more than one node holds some"


def test_round_trip_wait_list_and_delete_across_instances(services):
    _, (a, b) = services
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, size=5 * MiB + 3, dtype=np.uint8)
    a.put(batch_key("rt", 0, "rollout", shard=1), {"data": data, "rows": np.arange(5 * MiB + 3, dtype=np.int8)})
    assert b.get(batch_key("rt", 0, "rollout", shard=1))["data"].tobytes() == data.tobytes()
    timer = threading.Timer(0.3, a.put, args=(batch_key("rt", 1, "late"), {"x": np.arange(4)}))
    start = time.monotonic()
    timer.start()
    assert np.array_equal(b.get(batch_key("rt", 1, "late"), wait_seconds=10)["x"], np.arange(4))
    assert time.monotonic() - start < 2.5, "the commit notification crossed the cluster and the instances"
    assert [(k.step, k.node_id) for k in b.list("rt")] == [(0, "rollout"), (1, "late")]
    assert a.delete_job("rt") == (2, 0) and b.list("rt") == []


def test_consumer_groups_ack_every_group_exactly_once(services):
    _, (a, b) = services
    ids = a.append_groups("cg", "s", [Group(f"g{i}", i % 3, {"x": np.arange(4) + i}) for i in range(30)])
    seen: list[str] = []
    for consumer, client in (("c1", a), ("c2", b)) * 20:
        result = client.read_groups("cg", "s", "train", consumer, max_groups=4, min_weight_version=1)
        seen += [g.entry_id for g in result.groups]
        assert client.ack("cg", "s", "train", [g.entry_id for g in result.groups]) == len(result.groups)
        if len(seen) == 20:
            break
    assert sorted(seen) == sorted(i for n, i in enumerate(ids) if n % 3)
    stats = b.stats("cg")
    assert stats.drops_by_reason == {"stale": 10}
    assert [(s.length, s.pending, s.lag) for s in stats.streams] == [(0, 0, 0)]


def test_unacked_groups_are_claimed_by_another_consumer(services):
    _, (a, b) = services
    ids = a.append_groups("claim", "s", [Group(f"g{i}", 1, {"x": np.arange(2)}) for i in range(3)])
    assert [g.entry_id for g in a.read_groups("claim", "s", "train", "dies", max_groups=3).groups] == ids
    time.sleep(0.4)
    claimed = b.read_groups("claim", "s", "train", "heir", max_groups=3, claim_idle_seconds=0.3)
    assert [(g.entry_id, g.delivery_count) for g in claimed.groups] == [(i, 2) for i in ids]
    assert b.ack("claim", "s", "train", ids) == 3


def test_eight_producers_and_eight_consumers_over_two_instances(services):
    _, (a, b) = services
    expected, acks, deliveries, errors = run_producers_and_consumers([a.address, b.address], job="many")
    assert not errors, errors
    assert set(acks) == expected and set(acks.values()) == {1} and set(deliveries.values()) == {1}
    assert [(s.length, s.pending) for s in a.stats("many").streams] == [(0, 0)]


def test_on_a_cluster_the_direct_path_offers_no_zero_rpc_scripts(services):
    _, (client, _) = services
    layout = call(client._stub.DescribeDirectPath, pb.DescribeDirectPathRequest(), timeout=30)
    assert layout.chunk_key_template and not layout.HasField("zero_rpc")  # their keys would span slots
