"""The rollout router over in-process replicas registered in Redis: spreading by outstanding work,
groups and sessions kept on one replica, work of a stopped replica retried elsewhere, draining, and a fleet
whose launched replicas exit: the others take the work, and with none left it fails at once."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import numpy as np
import pytest
import redis

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.errors import ResourceExhausted, Unavailable
from meshrl.common.grpc_server import ServerConfig, start_server
from meshrl.common.registry import Heartbeat, ReplicaRegistry
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.server import service
from meshrl.scheduler.fleet.rollout_fleet import RolloutFleet
from meshrl.scheduler.fleet.router import RolloutRouter
from meshrl.scheduler.fleet.router_types import StaleFleet
from tests._databuffer import SYSTEM_REDIS, served_client


class LocalReplica:
    """A replica server in this process (sharing one engine), registered with heartbeats."""

    def __init__(self, rid: str, engine, buffer, registry: ReplicaRegistry) -> None:
        self.replica = RolloutReplica(engine, replica_id=rid, capacity=8, databuffer=buffer, buffer_wait_s=5)
        self.replica.mark_serving()
        self.running = start_server(ServerConfig(port=0), [service(self.replica)])
        self.heartbeat = Heartbeat(registry, lambda: self.replica.info(self.running.address), 0.2)
        self.heartbeat.start()

    def kill(self) -> None:
        self.heartbeat.stop()
        self.running.stop(0)


@pytest.fixture(scope="module")
def buffer():
    with served_client("router") as client:
        yield client


@pytest.fixture
def fleet(engine, buffer):
    namespace = f"routertest-{uuid.uuid4().hex[:8]}"
    registry = ReplicaRegistry(SYSTEM_REDIS, namespace=namespace, ttl_seconds=1.0)
    replicas = [LocalReplica(f"r{i}", engine, buffer, registry) for i in range(3)]
    router = RolloutRouter(registry=registry, databuffer=buffer, watch_interval_s=0.1, rpc_timeout_s=120)
    router.wait_for_replicas(3, timeout=10)
    yield router, replicas, registry
    router.close()
    for r in replicas:
        r.kill()
    client = redis.Redis.from_url(SYSTEM_REDIS)
    for key in client.scan_iter(match=f"{namespace}:*"):
        client.delete(key)


def put_prompts(buffer, job: str, count: int):
    key = batch_key(job, 0, "data")
    rows = [[1 + i % 7, 2, 3 + i % 5] for i in range(count)]
    buffer.put(key, {S.PROMPT_IDS: Ragged.from_rows(rows, dtype=np.int32)})
    return key, rows


def check_complete(batch, prompts: int, n: int) -> None:
    pairs = sorted(zip(batch[S.GROUP_INDEX].tolist(), [m.index_in_group for m in batch.samples]))
    assert pairs == [(p, k) for p in range(prompts) for k in range(n)]  # every sample once, none twice


def test_batch_is_spread_and_groups_stay_together(fleet, buffer):
    router, _, _ = fleet
    source, _ = put_prompts(buffer, "spread", 12)
    out = batch_key("spread", 0, "rollout")
    result = router.generate_batch(source, out, {"temperature": 0.8, "max_tokens": 8, "seed": 3}, n=4, job_id="spread")
    assert result.keys == [out] and result.samples == 48
    assert len(result.samples_by_replica) >= 2
    assert all(v % 4 == 0 for v in result.samples_by_replica.values())  # a group never splits
    batch = buffer.get(out)
    check_complete(batch, 12, 4)
    assert batch[S.GROUP_INDEX].tolist() == sorted(batch[S.GROUP_INDEX].tolist())


def test_sessions_stick_to_one_replica(fleet):
    router, _, _ = fleet
    seen = {
        router.generate([1, 2, 3, t], sampling={"temperature": 0, "max_tokens": 3}, session_id="s1").replica_id
        for t in range(5)
    }
    assert len(seen) == 1


def test_work_of_a_stopped_replica_completes_elsewhere(fleet, buffer):
    router, replicas, _ = fleet
    source, _ = put_prompts(buffer, "kill", 24)
    out = batch_key("kill", 0, "rollout")
    holder = {}

    def run():
        holder["result"] = router.generate_batch(
            source, out, {"temperature": 1.0, "max_tokens": 40, "ignore_eos": True}, n=2, chunk_prompts=2
        )

    thread = threading.Thread(target=run)
    thread.start()
    while not any(r.calls for r in router.replicas() if r.replica_id == "r1"):
        time.sleep(0.01)
    replicas[1].kill()
    thread.join(timeout=120)
    result = holder["result"]
    assert result.samples == 48 and result.retries >= 1
    check_complete(buffer.get(out), 24, 2)


def test_drain_stops_routing_to_a_replica(fleet, buffer):
    router, _, registry = fleet
    assert router.drain("r0", timeout=30)
    deadline = time.monotonic() + 5
    while registry.get("r0").state != "draining" and time.monotonic() < deadline:
        time.sleep(0.05)
    source, _ = put_prompts(buffer, "drain", 8)
    result = router.generate_batch(source, batch_key("drain", 0, "rollout"), {"max_tokens": 4}, n=1, chunk_prompts=1)
    assert "r0" not in result.samples_by_replica and result.samples == 8


def test_a_fixed_address_list_can_be_changed(fleet, buffer):
    _, replicas, _ = fleet
    addresses = [r.running.address for r in replicas]
    router = RolloutRouter(addresses=addresses, databuffer=buffer, default_capacity=4)
    try:
        source, _ = put_prompts(buffer, "static", 6)
        out = batch_key("static", 0, "rollout")
        first = router.generate_batch(source, out, {"max_tokens": 3}, n=2, chunk_prompts=1)
        assert len(first.samples_by_replica) >= 2
        router.set_addresses(addresses[:1])
        second = router.generate_batch(source, out, {"max_tokens": 3}, n=2, chunk_prompts=1, merge=False)
        assert set(second.samples_by_replica) == {addresses[0]} and len(second.keys) == 6
        assert [k.shard for k in second.keys] == list(range(6))
    finally:
        router.close()


@contextlib.contextmanager
def fleet_one_behind(engine, new_engine, model_dir, buffer, names: tuple[str, str]):
    """Two replicas on a fresh registry: names[0] serves the initial weights, names[1] weight version 3 (the
    job's: router.min_version = 3). Yields (router, replicas, addresses the router reported behind)."""
    namespace = f"routertest-{uuid.uuid4().hex[:8]}"
    registry = ReplicaRegistry(SYSTEM_REDIS, namespace=namespace, ttl_seconds=1.0)
    current = new_engine(model_dir, max_batch_size=16)
    current.batcher.version = 3  # as if weight version 3 had been published to it
    replicas = [LocalReplica(names[0], engine, buffer, registry), LocalReplica(names[1], current, buffer, registry)]
    router = RolloutRouter(registry=registry, databuffer=buffer, watch_interval_s=0.1, rpc_timeout_s=120)
    behind: list[str] = []
    router.on_behind = behind.append
    try:
        router.wait_for_replicas(2, timeout=10)
        router.min_version = 3
        yield router, replicas, behind
    finally:
        router.close()
        for r in replicas:
            r.kill()
        for key in redis.Redis.from_url(SYSTEM_REDIS).scan_iter(match=f"{namespace}:*"):
            redis.Redis.from_url(SYSTEM_REDIS).delete(key)


def test_a_replica_behind_the_jobs_weight_version_is_left_out_and_reported(engine, new_engine, model_dir, buffer):
    """A replica restarted on its address (or one that missed an update unnoticed) answers with older
    weights: its rows are generated again elsewhere and the router reports it; with none left, it refuses."""
    with fleet_one_behind(engine, new_engine, model_dir, buffer, ("old", "new")) as (router, replicas, behind):
        source, _ = put_prompts(buffer, "behind", 8)
        out = batch_key("behind", 0, "rollout")
        result = router.generate_batch(source, out, {"max_tokens": 4}, n=1, chunk_prompts=1)
        assert result.samples == 8 and set(result.samples_by_replica) == {"new"}
        assert result.min_weight_version == 3 and behind == [replicas[0].running.address] * len(behind)
        check_complete(buffer.get(out), 8, 1)

        router.min_version = 4  # no replica serves it: refused at once, not after the deadline
        started = time.monotonic()
        with pytest.raises(Unavailable, match="weight version 3 but the job is at version 4"):
            router.generate_batch(source, batch_key("behind", 1, "rollout"), {"max_tokens": 4}, n=1)
        assert time.monotonic() - started < 60


def test_a_stream_from_a_replica_behind_the_jobs_weight_version_is_made_elsewhere(
    engine, new_engine, model_dir, buffer
):
    """GenerateStream (multi-turn episodes) applies the same floor as GenerateBatch: a replica whose first
    tokens come from older weights is reported and the response is made on another one; with none left, the
    call fails at once with the reason instead of retrying until its deadline."""
    with fleet_one_behind(engine, new_engine, model_dir, buffer, ("r0", "r1")) as (router, replicas, behind):
        out = router.generate([1, 2, 3], sampling={"max_tokens": 4}, session_id="episode-0")
        assert out.replica_id == "r1" and out.token_ids and min(out.weight_versions) == 3
        assert set(behind) == {replicas[0].running.address}
        again = router.generate([1, 2, 3, 4], sampling={"max_tokens": 4}, session_id="episode-0")
        assert again.replica_id == "r1"  # the session moved to the replica that serves the job's weights

        router.min_version = 4  # no replica serves it: refused with the reason, not after the deadline
        with pytest.raises(StaleFleet, match="the job is at version 4"):
            router.generate([1, 2, 3], sampling={"max_tokens": 4}, session_id="episode-1")


def test_a_batch_of_one_range_is_generated_from_the_calling_thread(fleet, buffer):
    """One row range (one replica): its GenerateBatch goes out from the caller's thread, not a pool thread
    started per call; several ranges still go out concurrently."""
    router, _, _ = fleet
    threads, real = [], router._run_range

    def recording(*args):
        threads.append(threading.current_thread())
        return real(*args)

    router._run_range = recording
    source, _ = put_prompts(buffer, "single", 1)
    result = router.generate_batch(
        source, batch_key("single", 0, "rollout"), {"max_tokens": 4, "seed": 1}, n=2, job_id="single", merge=False
    )
    assert result.samples == 2 and threads == [threading.current_thread()]  # was: a "router" pool thread
    threads.clear()
    source, _ = put_prompts(buffer, "several", 12)
    router.generate_batch(
        source, batch_key("several", 0, "rollout"), {"max_tokens": 4, "seed": 1}, n=4, job_id="several", merge=False
    )
    assert len(threads) >= 2 and threading.current_thread() not in threads


def test_a_fleet_whose_replicas_exit_fails_over_then_fails_at_once(fleet, buffer):
    """What the job does when its exit watch sees a launched replica die (launch/services.py)."""
    _, replicas, _ = fleet
    addresses = [r.running.address for r in replicas[:2]]
    rollouts = RolloutFleet(buffer, addresses, timeout=120)
    source, _ = put_prompts(buffer, "exits", 4)
    args = dict(job_id="exits", step=1, n=2, temperature=1.0, top_p=1.0, max_tokens=3, num_prompts=4)
    try:
        rollouts.exited(addresses[0])
        _, metrics = rollouts.generate(source, node_id="rollout", **args)
        assert metrics["rollout/samples"] == 8 and rollouts.addresses() == addresses[1:]
        rollouts.exited(addresses[1])
        with pytest.raises(Unavailable, match=f"the last one, {addresses[1]}, exited"):  # not after 120 s
            rollouts.generate(source, node_id="rollout2", **args)
    finally:
        rollouts.close()


def test_a_stream_refused_by_a_busy_replica_goes_to_another(fleet):
    """A replica whose GenerateStream slots are all held (limits.max_streams) refuses with RESOURCE_EXHAUSTED:
    busy, not failed, so the stream is made on a replica with a free slot and the busy ones are not
    quarantined; with every replica busy, the refusal (naming the setting) reaches the caller after a few
    growing pauses."""
    router, replicas, _ = fleet
    for r in replicas[:2]:
        r.replica.streams.limit = 0
    for i in range(4):
        out = router.generate([1, 2, 3], sampling={"max_tokens": 3}, session_id=f"busy-{i}")
        assert out.replica_id == "r2" and len(out.token_ids) == 3
    assert not any(r.failed_at for r in router._replicas.values())
    replicas[2].replica.streams.limit = 0
    with pytest.raises(ResourceExhausted, match="limits.max_streams"):
        router.generate([1, 2, 3], sampling={"max_tokens": 3})
