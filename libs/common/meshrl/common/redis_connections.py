"""redis-py connection classes that send large values as they are: used by the data buffer service and by
clients of its direct data path (meshrl.common.direct_path), which move the same payloads.

With hiredis installed redis-py packs commands with hiredis, which copies every value: measured 7-10x slower
SETs of 4 MiB. These classes pack in Python (a large value goes to the socket uncopied) and keep hiredis for
the replies (5x faster GETs of 4 MiB).
"""

from __future__ import annotations

from typing import Any

import redis
from redis.connection import Encoder, PythonRespSerializer


class _PythonPacker:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        encoder = Encoder(kwargs.get("encoding", "utf-8"), kwargs.get("encoding_errors", "strict"), False)
        kwargs.setdefault("command_packer", PythonRespSerializer(6000, encoder.encode))
        super().__init__(*args, **kwargs)


class FastConnection(_PythonPacker, redis.Connection):
    """TCP (redis://)."""


class FastUnixConnection(_PythonPacker, redis.UnixDomainSocketConnection):
    """Unix socket (unix://)."""


class FastSSLConnection(_PythonPacker, redis.SSLConnection):
    """TLS (rediss://)."""


CONNECTION_CLASSES = {"redis": FastConnection, "unix": FastUnixConnection, "rediss": FastSSLConnection}
