"""A put that Redis died in the middle of: once Redis is back (same data, AOF on), the next put removes the
failed put's staged chunks and releases its budget, instead of leaving them for the staging TTL (an hour)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import redis

from meshrl.common.codec import encode_batch
from meshrl.common.errors import MeshrlError
from meshrl.databuffer.embedded import EmbeddedRedis
from meshrl.databuffer.keys import BatchRef
from meshrl.databuffer.store import DataBuffer
from tests._databuffer import config, unique_prefix

KiB = 1024


def _until_up(fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except MeshrlError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_chunks_staged_before_redis_died_are_removed_by_the_next_put(tmp_path):
    server = EmbeddedRedis(str(tmp_path / "redis"), appendfsync="always").start()
    prefix = unique_prefix("orphan")
    cfg = config(server.url, prefix, limits={"chunk_bytes": 64 * KiB}, redis={"retries": 1})
    buffer = DataBuffer.open(cfg)
    try:
        raw = redis.Redis(unix_socket_path=server.socket)
        baseline = set(raw.scan_iter(match=f"*{prefix}*"))
        header, views = encode_batch({"x": np.arange(200_000, dtype=np.int64)})
        data = b"".join(bytes(v) for v in views)

        def frames():
            for i in range(0, len(data), 64 * KiB):
                if i == 4 * 64 * KiB:
                    server.kill()  # mid-put: four chunks are staged
                yield data[i : i + 64 * KiB]

        with pytest.raises(MeshrlError):
            buffer.put_batch(BatchRef("job", 0, "dead"), header, frames())
        server.start()
        raw = redis.Redis(unix_socket_path=server.socket)
        staged = set(raw.scan_iter(match=f"*{prefix}*")) - baseline
        assert staged, "the AOF kept the staged chunks (the case this test is about)"
        assert len(buffer.batches.orphans) == 1
        ok_header, ok_views = encode_batch({"y": np.arange(4)})
        _until_up(lambda: buffer.put_batch(BatchRef("job", 0, "ok"), ok_header, [bytes(v) for v in ok_views]))
        assert len(buffer.batches.orphans) == 0
        assert [k for k in raw.scan_iter(match=f"*{prefix}*") if b"dead" in k] == [], "staged chunks are left"
        ledger_members = [
            m for k in raw.scan_iter(match=f"*{prefix}*") if raw.type(k) == b"zset" for m in raw.zrange(k, 0, -1)
        ]
        assert ledger_members and not [m for m in ledger_members if b"dead" in m], "the reservation is still held"
    finally:
        buffer.close()
        server.stop()


def test_an_embedded_redis_that_dies_is_restarted_and_keeps_acknowledged_data(tmp_path):
    import os
    import signal

    cfg = config(
        None, unique_prefix("watch"), redis={"embedded": {"data_dir": str(tmp_path / "r"), "appendfsync": "always"}}
    )
    buffer = DataBuffer.open(cfg)
    try:
        buffer.put_columns(BatchRef("job", 1, "kept"), {"x": np.arange(10)})
        os.kill(buffer.handle.embedded.pid, signal.SIGKILL)
        got = _until_up(lambda: buffer.get_batch(BatchRef("job", 1, "kept")))
        assert got["x"].tolist() == list(range(10)) and buffer.handle.watchdog.restarts == 1
        buffer.put_columns(BatchRef("job", 2, "after"), {"x": np.arange(3)})
    finally:
        buffer.close()
