"""meshrl.common.resp_read: the RESP2 / RESP3 replies the zero-RPC get reads off a real socket (a socketpair),
large bulk strings landing in writable numpy buffers; a reply cut short or of an unknown type is a
ConnectionError; and against the machine's Redis, execute_raw returns what redis-py would and leaves the
connection usable (or disconnected after a failure)."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import redis
from redis.exceptions import NoScriptError

from meshrl.common.resp_read import BIG, _Reader, execute_raw

SYSTEM_REDIS = "redis://127.0.0.1:6379/0"


def _read(wire: bytes, close: bool = False):
    a, b = socket.socketpair()
    try:
        a.sendall(wire)
        if close:
            a.close()
        return _Reader(b).read()
    finally:
        b.close()
        if not close:
            a.close()


def test_every_reply_type_it_knows_is_read():
    big = bytes(range(256)) * (BIG // 256 + 3)
    wire = b"*8\r\n+OK\r\n:42\r\n$3\r\nabc\r\n$-1\r\n_\r\n" + b"$%d\r\n" % len(big) + big + b"\r\n"
    wire += b"-NOSCRIPT No matching script\r\n!5\r\nERR x\r\n"
    ok, num, small, null2, null3, payload, noscript, blob_error = _read(wire)
    assert (ok, num, small, null2, null3) == (b"OK", 42, b"abc", None, None)
    assert isinstance(payload, np.ndarray) and payload.tobytes() == big and payload.flags.writeable
    assert isinstance(noscript, NoScriptError) and isinstance(blob_error, redis.ResponseError)


def test_a_reply_cut_short_or_of_an_unknown_type_is_a_connection_error():
    with pytest.raises(redis.ConnectionError, match="middle of a value"):
        _read(b"$10000\r\n" + b"x" * 5000, close=True)
    with pytest.raises(redis.ConnectionError, match="middle of a reply"):
        _read(b"*2\r\n:1\r\n", close=True)
    with pytest.raises(redis.ConnectionError, match="unexpected reply type"):
        _read(b"%1\r\n+a\r\n+b\r\n")


def test_execute_raw_matches_redis_py_and_keeps_the_connection_usable():
    client = redis.Redis.from_url(SYSTEM_REDIS)
    key = "{mdbtest-resp}:v"
    value = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    try:
        client.set(key, value)
        replies = execute_raw(client, [("MULTI",), ("GET", key), ("STRLEN", key), ("GET", key + "x"), ("EXEC",)])
        got, size, missing = replies[-1]
        assert got.tobytes() == value and size == len(value) and missing is None
        assert client.get(key) == value  # the pooled connection is clean for redis-py afterwards
        bad = execute_raw(client, [("EVALSHA", "0" * 40, 0)])
        assert isinstance(bad[0], NoScriptError) and client.ping()
    finally:
        client.delete(key)
        client.close()
