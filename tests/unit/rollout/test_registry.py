"""The replica registry on the machine's Redis (a unique namespace per test): heartbeats with a TTL,
drain requests, the job's current weights, and watching for changes."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from meshrl.common.errors import DeadlineExceeded, InvalidArgument
from meshrl.common.registry import DRAINING, SERVING, STARTING, CurrentWeights, Heartbeat, ReplicaInfo, ReplicaRegistry

REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture
def registry():
    namespace = f"rolltest-{uuid.uuid4().hex[:8]}"
    reg = ReplicaRegistry(REDIS, namespace=namespace, ttl_seconds=0.6)
    yield reg
    client = redis.Redis.from_url(REDIS)
    for key in client.scan_iter(match=f"{namespace}:*"):
        client.delete(key)


def info(rid: str, state: str = SERVING, version: int = 0) -> ReplicaInfo:
    return ReplicaInfo(
        replica_id=rid,
        address=f"127.0.0.1:{1000 + len(rid)}",
        engine="transformers",
        capacity=8,
        weight_version=version,
        state=state,
    )


def test_heartbeat_ttl_drain_and_deregister(registry):
    registry.heartbeat(info("a", STARTING))
    registry.heartbeat(info("b", SERVING, 3))
    listed = registry.list()
    assert [(r.replica_id, r.state, r.weight_version) for r in listed] == [("a", STARTING, 0), ("b", SERVING, 3)]
    assert listed[1].capacity == 8 and listed[1].updated_at > 0
    assert [r.replica_id for r in registry.list(states=[SERVING])] == ["b"]
    registry.request_drain("b")
    assert registry.get("b").state == DRAINING and registry.drain_requested("b")
    registry.deregister("b")
    assert registry.get("b") is None and not registry.drain_requested("b")
    time.sleep(0.8)  # "a" stopped beating: its entry expires
    assert registry.list() == []


def test_heartbeat_thread_keeps_the_entry_alive_and_deregisters_on_stop(registry):
    state = {"version": 0}
    beat = Heartbeat(registry, lambda: info("r1", SERVING, state["version"]), interval=0.1)
    beat.start()
    try:
        state["version"] = 5
        time.sleep(1.0)  # longer than the TTL
        assert registry.get("r1").weight_version == 5
    finally:
        beat.stop(deregister_id="r1")
    assert registry.get("r1") is None


def test_current_weights_and_bad_entries(registry):
    assert registry.current_weights() is None
    registry.set_current_weights(CurrentWeights(7, "/w/v000007"))
    assert registry.current_weights() == CurrentWeights(7, "/w/v000007")
    with pytest.raises(InvalidArgument, match="state"):
        registry.heartbeat(info("x", "sleeping"))
    with pytest.raises(InvalidArgument, match="address"):
        registry.heartbeat(ReplicaInfo(replica_id="x", address=""))


def test_watch_reports_changes(registry):
    seen: list[list[str]] = []
    changed = threading.Event()

    def on_change(replicas):
        seen.append([f"{r.replica_id}:{r.state}" for r in replicas])
        changed.set()

    watcher = registry.watch(on_change, interval=0.1)
    try:
        registry.heartbeat(info("w1"))
        deadline = time.monotonic() + 5
        while ["w1:serving"] not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        registry.request_drain("w1")
        while ["w1:draining"] not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        registry.deregister("w1")
        while seen[-1] != [] and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watcher.stop()
    assert ["w1:serving"] in seen and ["w1:draining"] in seen and seen[-1] == []
    with pytest.raises(DeadlineExceeded, match="did not reach"):
        registry.wait_for(lambda rs: len(rs) == 2, timeout=0.3)
