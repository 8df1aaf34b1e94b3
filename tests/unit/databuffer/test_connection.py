"""Connecting to Redis: password and ACL user from the URL or from config fields, a refused login
named as a config error, an unreachable Redis as UNAVAILABLE, and the embedded default started
and stopped with the buffer."""

from __future__ import annotations

import os

import numpy as np
import pytest

from meshrl.common.errors import ConfigError, Unavailable
from meshrl.common.net import free_port
from meshrl.databuffer.embedded import EmbeddedRedis
from meshrl.databuffer.keys import BatchRef
from meshrl.databuffer.store import DataBuffer
from tests._databuffer import config


@pytest.fixture(scope="module")
def secured():
    """An embedded redis-server on a TCP port with a default password and an ACL user."""
    port = free_port()
    extra = {"requirepass": "defaultpw", "user": "alice on >alicepw ~* &* +@all"}
    with EmbeddedRedis(port=port, extra=extra) as server:
        yield port, server


def _round_trip(buffer: DataBuffer) -> None:
    buffer.put_columns(BatchRef("job", 0, "n"), {"x": np.arange(5)})
    assert np.array_equal(buffer.get_batch(BatchRef("job", 0, "n"))["x"], np.arange(5))
    buffer.delete_job("job")


def test_acl_user_and_password_in_the_url(secured):
    port, _ = secured
    buffer = DataBuffer.open(config(f"redis://alice:alicepw@127.0.0.1:{port}/0", "acl"))
    _round_trip(buffer)
    buffer.close()


def test_password_and_user_as_fields_or_from_the_environment(secured, monkeypatch):
    port, _ = secured
    cfg = config(f"redis://127.0.0.1:{port}/0", "fields")
    cfg.redis.password = "defaultpw"
    buffer = DataBuffer.open(cfg)
    _round_trip(buffer)
    buffer.close()
    cfg = config(f"redis://127.0.0.1:{port}/0", "fields")
    cfg.redis.username = "alice"
    monkeypatch.setitem(os.environ, cfg.redis.password_env, "alicepw")
    buffer = DataBuffer.open(cfg)
    _round_trip(buffer)
    buffer.close()


def test_a_refused_login_is_a_config_error_without_the_password(secured):
    port, _ = secured
    with pytest.raises(ConfigError, match=r"redis.url.*\*\*\*@127.0.0.1.*refused the login") as info:
        DataBuffer.open(config(f"redis://alice:wrong@127.0.0.1:{port}/0", "bad"))
    assert "wrong" not in str(info.value)


def test_an_unreachable_redis_is_unavailable():
    with pytest.raises(Unavailable, match=r"cannot reach Redis at redis://127.0.0.1:\d+/0"):
        DataBuffer.open(config(f"redis://127.0.0.1:{free_port()}/0", "down", redis={"connect_timeout_seconds": 1}))


def test_the_embedded_default_keeps_its_data_in_the_configured_folder(tmp_path):
    cfg = config(None, "emb", redis={"embedded": {"data_dir": str(tmp_path)}})
    buffer = DataBuffer.open(cfg)
    pid = buffer.handle.embedded.pid
    _round_trip(buffer)
    buffer.put_columns(BatchRef("job", 1, "kept"), {"x": np.arange(3)})
    buffer.close()
    assert not os.path.exists(f"/proc/{pid}/status") or "zombie" in open(f"/proc/{pid}/status").read().lower()
    again = DataBuffer.open(cfg)  # same folder: the append-only file brings the batch back
    assert np.array_equal(again.get_batch(BatchRef("job", 1, "kept"))["x"], np.arange(3))
    again.close()
