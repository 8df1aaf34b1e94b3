"""Durability: the service over its own redis-server with the append-only file on (fsync always).
Redis is killed with SIGKILL mid-run and restarted on the same data: every put the service
acknowledged is still there bit for bit, and unacked stream groups are still pending."""

from __future__ import annotations

import time

import numpy as np
import pytest

from meshrl.common.batch_key import batch_key
from meshrl.common.databuffer_client import DataBufferClient, Group
from meshrl.common.errors import DeadlineExceeded, Unavailable
from meshrl.databuffer.embedded import EmbeddedRedis
from tests._databuffer import config, serving, unique_prefix

KiB = 1024


def _retry(fn, timeout: float = 30.0):
    """Calls fn until Redis answers again (UNAVAILABLE while it restarts or loads the AOF)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_acknowledged_puts_survive_a_redis_crash_and_restart(tmp_path):
    redis_server = EmbeddedRedis(str(tmp_path / "redis"), appendfsync="always").start()
    try:
        cfg = config(redis_server.url, unique_prefix("aof"), limits={"chunk_bytes": 256 * KiB})
        with serving(cfg) as (_, running):
            client = DataBufferClient(running.address)
            rng = np.random.default_rng(3)
            written = {}
            for step in range(12):
                data = rng.integers(0, 256, size=int(rng.integers(1, 1_500_000)), dtype=np.uint8)
                client.put(batch_key("job", step, "rollout"), {"data": data})
                written[step] = data
            ids = client.append_groups("job", "s", [Group(f"g{i}", 1, {"x": np.arange(4) + i}) for i in range(6)])
            delivered = client.read_groups("job", "s", "train", "c", max_groups=4)
            client.ack("job", "s", "train", [g.entry_id for g in delivered.groups[:2]])

            redis_server.kill()
            with pytest.raises((Unavailable, DeadlineExceeded)):  # the channel retries UNAVAILABLE until the deadline
                client.get(batch_key("job", 0, "rollout"), timeout=2)
            redis_server.start()

            for step, data in written.items():
                got = _retry(lambda step=step: client.get(batch_key("job", step, "rollout")))
                assert got["data"].tobytes() == data.tobytes(), f"step {step} changed across the restart"
            assert len(client.list("job")) == len(written)
            (stat,) = client.stats("job").streams
            assert (stat.pending, stat.lag) == (2, 2), "2 delivered unacked, 2 never delivered"
            rest = client.read_groups("job", "s", "train", "c2", max_groups=10, claim_idle_seconds=0.01)
            assert sorted(g.entry_id for g in rest.groups) == sorted(ids[2:])
            assert client.ack("job", "s", "train", ids[2:]) == 4
            client.close()
    finally:
        redis_server.stop()
