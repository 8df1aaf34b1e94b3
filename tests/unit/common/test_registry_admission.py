"""Registry entries are admitted by the service token: with it, a replica's entry and the job's current weights
carry an HMAC of the token, and a reader holding the token ignores what a stranger wrote into the registry's
Redis (an unsigned entry, a signed one whose address was changed, forged current weights); a malformed entry is
skipped with a warning instead of failing the whole listing (and with it the fleet's updates)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from meshrl.common.registry import CurrentWeights, ReplicaInfo, ReplicaRegistry

REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture()
def namespace():
    namespace = f"admit-{uuid.uuid4().hex[:8]}"
    yield namespace
    client = redis.Redis.from_url(REDIS)
    for key in client.scan_iter(match=f"{namespace}:*"):
        client.delete(key)
    client.close()


def _replica(rid: str, port: int) -> ReplicaInfo:
    return ReplicaInfo(replica_id=rid, address=f"127.0.0.1:{port}", state="serving", capacity=4)


def test_a_reader_with_the_token_lists_only_entries_signed_with_it(namespace):
    ours = ReplicaRegistry(REDIS, namespace=namespace, token="service-token")
    stranger = ReplicaRegistry(REDIS, namespace=namespace)  # can write the Redis, has no token
    forger = ReplicaRegistry(REDIS, namespace=namespace, token="guessed")
    ours.heartbeat(_replica("real", 50053))
    stranger.heartbeat(_replica("rogue", 6666))
    forger.heartbeat(_replica("forged", 6667))
    ours.heartbeat(_replica("moved", 50054))
    ours.redis.hset(f"{namespace}:rollout:replica:moved", "address", "127.0.0.9:6666")  # changed after signing
    assert [r.replica_id for r in ours.list()] == ["real"]
    assert ours.get("rogue") is None and ours.get("real").address == "127.0.0.1:50053"
    assert {r.replica_id for r in stranger.list()} == {"real", "rogue", "forged", "moved"}  # no token: no check


def test_a_malformed_entry_is_skipped_not_fatal(namespace, caplog):
    registry = ReplicaRegistry(REDIS, namespace=namespace)
    registry.heartbeat(_replica("good", 50053))
    registry.redis.hset(
        f"{namespace}:rollout:replica:bad", mapping={"replica_id": "bad", "address": "x:1", "capacity": "lots"}
    )
    registry.redis.hset(f"{namespace}:rollout:replica:noport", mapping={"replica_id": "noport", "address": "h"})
    assert [r.replica_id for r in registry.list()] == ["good"]
    assert "malformed" in caplog.text and "replica:bad" in caplog.text


def test_forged_current_weights_are_ignored_by_a_replica_with_the_token(namespace):
    scheduler = ReplicaRegistry(REDIS, namespace=namespace, token="service-token")
    replica = ReplicaRegistry(REDIS, namespace=namespace, token="service-token")
    scheduler.set_current_weights(CurrentWeights(3, "/runs/r/weights/v000003"))
    assert replica.current_weights() == CurrentWeights(3, "/runs/r/weights/v000003")
    replica.redis.set(f"{namespace}:rollout:current_weights", json.dumps({"version": 9, "path": "/tmp/evil"}))
    assert replica.current_weights() is None
    replica.redis.set(f"{namespace}:rollout:current_weights", "{not json")
    assert replica.current_weights() is None and ReplicaRegistry(REDIS, namespace=namespace).current_weights() is None
