"""Reads Redis replies straight off a redis-py connection's socket, so that a large bulk string lands in a numpy
buffer this process owns (`recv_into`: no bytes object, no second copy, the arrays stay writable): the zero-RPC
get's payload (meshrl.common.zero_rpc). Speaks RESP2 and RESP3 (what redis-py negotiated). Any surprise (a reply
type it does not know, a short read, a timeout) disconnects the connection, so the pool never hands out a
socket in the middle of a reply. It relies on redis-py's Connection keeping its socket in `_sock` (redis-py 5
to 8); the pool connects it and checks that it holds no stale reply before handing it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import redis
from redis.exceptions import NoScriptError

BIG = 4096  # bulk strings from this many bytes go into numpy buffers


class _Reader:
    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._buf = bytearray()
        self._pos = 0

    def _fill(self) -> None:
        chunk = self._sock.recv(1 << 16)
        if not chunk:
            raise redis.ConnectionError("Redis closed the connection in the middle of a reply")
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += chunk

    def _line(self) -> bytes:
        while (end := self._buf.find(b"\r\n", self._pos)) < 0:
            self._fill()
        line = bytes(self._buf[self._pos : end])
        self._pos = end + 2
        return line

    def _bulk(self, n: int) -> bytes | np.ndarray:
        have = len(self._buf) - self._pos
        if n < BIG:
            while len(self._buf) - self._pos < n + 2:
                self._fill()
            data = bytes(self._buf[self._pos : self._pos + n])
            self._pos += n + 2
            return data
        out = np.empty(n + 2, dtype=np.uint8)  # the value and its \r\n, read in place
        view = memoryview(out)
        take = min(have, n + 2)
        view[:take] = self._buf[self._pos : self._pos + take]
        self._pos += take
        got = take
        while got < n + 2:
            k = self._sock.recv_into(view[got:])
            if not k:
                raise redis.ConnectionError("Redis closed the connection in the middle of a value")
            got += k
        return out[:n]

    def read(self) -> Any:
        """One reply: bytes, np.ndarray (large bulk strings), int, None, list, or an error instance."""
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            message = rest.decode(errors="replace")
            return NoScriptError(message) if message.startswith("NOSCRIPT") else redis.ResponseError(message)
        if kind == b":":
            return int(rest)
        if kind in (b"$", b"!"):
            n = int(rest)
            if n < 0:
                return None
            data = self._bulk(n)
            return redis.ResponseError(bytes(data).decode(errors="replace")) if kind == b"!" else data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        if kind == b"_":
            return None
        raise redis.ConnectionError(f"unexpected reply type {kind!r} from Redis")


def execute_raw(client: redis.Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Sends `commands` in one write and returns their replies (errors as instances), read by `_Reader`."""
    pool = client.connection_pool
    try:
        conn = pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        conn = pool.get_connection(str(commands[0][0]))
    try:
        reader = getattr(getattr(conn, "_parser", None), "_reader", None)
        sock = getattr(conn, "_sock", None)  # connected by the pool, which also checked it holds no stale reply
        if sock is None or (reader is not None and reader.has_data()):
            raise redis.ConnectionError("the connection is not connected, or holds an unread reply")
        conn.send_packed_command(conn.pack_commands(commands))
        raw = _Reader(sock)
        return [raw.read() for _ in commands]
    except BaseException as exc:
        conn.disconnect()
        if isinstance(exc, OSError) and not isinstance(exc, redis.RedisError):
            raise redis.ConnectionError(f"reading from Redis failed: {exc}") from exc
        raise
    finally:
        pool.release(conn)
