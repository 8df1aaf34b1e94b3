"""The embedded Redis cannot take the host's memory: its maxmemory follows the buffer's budget (a quarter more
for staged chunks, 64 MiB for Redis's own use) or `redis.embedded.maxmemory_bytes`, and the default budget is 8 GiB or
half the host's memory when that is less."""

from __future__ import annotations

from meshrl.databuffer import config as config_module
from meshrl.databuffer.config import BudgetConfig
from meshrl.databuffer.store import DataBuffer
from tests._databuffer import config, unique_prefix

MiB = 1 << 20


def _maxmemory(buffer: DataBuffer) -> int:
    return int(buffer.handle.client.config_get("maxmemory")["maxmemory"])


def test_the_embedded_redis_maxmemory_follows_the_budget_or_its_setting():
    buffer = DataBuffer.open(config(None, unique_prefix("mem"), budget={"max_bytes": 64 * MiB}))
    try:
        assert _maxmemory(buffer) == (64 + 16 + 64) * MiB
    finally:
        buffer.close()
    set_one = config(None, unique_prefix("mem"), redis={"embedded": {"maxmemory_bytes": 200 * MiB}})
    buffer = DataBuffer.open(set_one)
    try:
        assert _maxmemory(buffer) == 200 * MiB
    finally:
        buffer.close()


def test_the_default_budget_is_at_most_half_the_hosts_memory(monkeypatch):
    monkeypatch.setattr(config_module, "host_memory_bytes", lambda: 4 << 30)
    assert BudgetConfig().max_bytes == 2 << 30
    monkeypatch.setattr(config_module, "host_memory_bytes", lambda: 64 << 30)
    assert BudgetConfig().max_bytes == 8 << 30
    assert BudgetConfig(max_bytes=123).max_bytes == 123
