"""The client half of the data buffer's direct data path (opt-in): a batch's payload goes straight between
this process and Redis, with this process's own Redis credentials (and TLS), while every control decision
stays with the service (meshrl.databuffer.direct): where chunks go, header checks, budget, commit, which
bytes a selection reads. The payload crosses the network once, not twice through the service.

`DataBufferClient(..., direct=DirectPathConfig(redis_url=...))` uses it for every put and get of at least
`min_bytes` (a smaller get comes back inline from the same LocateBatch call); a whole-batch put of at most the
service's `embed_max_bytes` and a whole-batch get make no RPC at all (meshrl.common.zero_rpc, where the service
offers it: not on a Redis Cluster); with `fallback` on, an
unreachable Redis (or a service without the path) sends the batch through the service instead, which is
logged once.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pydantic
import redis

from meshrl.api.common.v1 import keys_pb2, tensor_pb2
from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.buffer_frames import split_frames
from meshrl.common.config import StrictModel
from meshrl.common.errors import ConfigError, DataLoss, NotFound, Unavailable
from meshrl.common.redis_connections import CONNECTION_CLASSES
from meshrl.common.zero_rpc import ZeroRpc, fill

log = logging.getLogger(__name__)
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
PIPELINE_BYTES = 64 << 20  # chunks staged per pipelined round trip, at most
READ_GROUP_BYTES = 8 << 20  # bytes read per pipelined round trip (the next group is fetched meanwhile)


class DirectPathConfig(StrictModel):
    """How this process reaches the data buffer's Redis itself (the same Redis the service uses)."""

    redis_url: str = pydantic.Field(
        description="redis://[user@]host:port/db, rediss:// (TLS) or unix:///path: the service's Redis as this "
        "process reaches it"
    )
    username: str | None = pydantic.Field(None, description="ACL user (overrides one in the URL)")
    password_env: str = pydantic.Field(
        "MESHRL_REDIS_PASSWORD", description="environment variable holding the password (never in config files)"
    )
    ca_file: str | None = pydantic.Field(None, description="rediss://: CA bundle that verifies Redis")
    min_bytes: int = pydantic.Field(
        256 << 10,
        ge=0,
        description="batches (and selections) smaller than this go through the service in one call: below a few "
        "hundred KiB the relay costs less than the extra Redis round trip",
    )
    socket_timeout_seconds: float = pydantic.Field(60.0, gt=0)
    fallback: bool = pydantic.Field(
        True, description="Redis unreachable, or a service without the direct path: relay through the service"
    )

    @pydantic.field_validator("redis_url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        scheme = url.partition("://")[0]
        if scheme not in CONNECTION_CLASSES:
            raise ValueError(f"scheme '{scheme}' is not one of {', '.join(s + '://' for s in CONNECTION_CLASSES)}")
        return url


def connect(cfg: DirectPathConfig) -> redis.Redis:
    """A checked connection (PING) to Redis; ConfigError when Redis refuses the login, Unavailable when it
    cannot be reached."""
    kwargs: dict[str, Any] = {
        "socket_timeout": cfg.socket_timeout_seconds,
        "socket_connect_timeout": min(5.0, cfg.socket_timeout_seconds),
        "connection_class": CONNECTION_CLASSES[cfg.redis_url.partition("://")[0]],
    }
    if cfg.username:
        kwargs["username"] = cfg.username
    if os.environ.get(cfg.password_env):
        kwargs["password"] = os.environ[cfg.password_env]
    if cfg.ca_file:
        kwargs["ssl_ca_certs"] = cfg.ca_file
    client = redis.Redis.from_url(cfg.redis_url, **kwargs)
    try:
        client.ping()
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        raise ConfigError(
            "direct.redis_url",
            _safe(cfg.redis_url),
            f"Redis refused the login ({exc})",
            f"check direct.username and ${cfg.password_env}",
        ) from None
    except TRANSIENT as exc:
        raise Unavailable(f"the data buffer's Redis at {_safe(cfg.redis_url)} is unreachable: {exc}") from None
    return client


def _safe(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.split('@', 1)[1]}" if "@" in rest else url


class DirectPath:
    """Stages and reads payload chunks in Redis on the layout a service described (DescribeDirectPath)."""

    def __init__(
        self, client: redis.Redis, layout: pb.DescribeDirectPathResponse, describe: Callable[[], Any] | None = None
    ) -> None:
        """`describe`: asks the service for the layout again (the zero-RPC path needs it after NOSCRIPT); without
        it, or when the service offers no zero-RPC path (a Redis Cluster), every put and get makes its RPC."""
        self.client = client
        self.template = layout.chunk_key_template
        self.chunk_bytes = int(layout.chunk_bytes)
        self.staging_ms = int(layout.staging_ttl_ms)
        self.zero = ZeroRpc(client, layout, describe) if describe and layout.HasField("zero_rpc") else None
        self._ahead = ThreadPoolExecutor(max_workers=4, thread_name_prefix="direct-read")

    def put_whole(self, key: keys_pb2.BatchKey, header: tensor_pb2.BatchHeader, views: list, **options: Any) -> int:
        """The zero-RPC put (options: ttl_seconds, overwrite) when it applies, else -1 (stage and commit)."""
        if self.zero is None or header.total_bytes > self.zero.embed_max_bytes:
            return -1
        return self.zero.put(key, header, views, **options)

    def get_whole(self, key: keys_pb2.BatchKey) -> tuple[tensor_pb2.BatchHeader, bytearray | np.ndarray] | None:
        """The whole batch with no RPC; None when that path is off or the batch is not there (yet)."""
        found = self.zero.get(key) if self.zero is not None else None
        if isinstance(found, pb.LocateBatchResponse):
            return found.header, self.read(found)
        return found

    def close(self) -> None:
        self._ahead.shutdown(wait=False)
        self.client.close()

    def chunk_key(self, key: keys_pb2.BatchKey, gen: str, index: int) -> str:
        return fill(self.template, key, gen, index)

    def stage(self, key: keys_pb2.BatchKey, views: Iterable[memoryview]) -> tuple[str, int]:
        """Writes the payload as chunks (staging TTL) under a fresh generation; returns it and the chunk count.
        Chunks of a put that is never committed expire on their own."""
        gen = secrets.token_hex(8)
        count, size = 0, 0
        pipe = self.client.pipeline(transaction=False)
        for frame in split_frames(views, self.chunk_bytes):
            pipe.set(self.chunk_key(key, gen, count), frame, px=self.staging_ms)
            count += 1
            size += memoryview(frame).nbytes
            if size >= PIPELINE_BYTES:
                pipe.execute()
                pipe, size = self.client.pipeline(transaction=False), 0
        if len(pipe):
            pipe.execute()
        return gen, count

    def read(self, located: pb.LocateBatchResponse) -> bytearray | np.ndarray:
        """The located payload, joined in one writable buffer (one copy of what Redis sent). Ranges are read in
        pipelined groups of about READ_GROUP_BYTES; the next group is fetched while this one is copied."""
        ranges = list(located.ranges)
        total = located.header.total_bytes
        groups: list[list[Any]] = []
        size = READ_GROUP_BYTES
        for r in ranges:
            if size >= READ_GROUP_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(r)
            size += r.last - r.first + 1
        if len(ranges) == 1:
            return bytearray(self._checked(located, groups[0])[0])
        buf = np.empty(total, dtype=np.uint8)
        pos = 0
        values = self._checked(located, groups[0]) if groups else []
        for k in range(len(groups)):
            ahead = self._ahead.submit(self._checked, located, groups[k + 1]) if k + 1 < len(groups) else None
            for data in values:
                buf[pos : pos + len(data)] = np.frombuffer(data, dtype=np.uint8)
                pos += len(data)
            values = ahead.result() if ahead is not None else []
        if pos != total:
            raise DataLoss(f"the located ranges hold {pos} bytes, the header announced {total}")
        return buf

    def _checked(self, located: pb.LocateBatchResponse, group: list[Any]) -> list[bytes]:
        """The values (or byte ranges) of `group` in one pipelined round trip, each of the size located."""
        pipe = self.client.pipeline(transaction=False)
        for r in group:
            if r.whole:
                pipe.get(r.key)
            else:
                pipe.getrange(r.key, r.first, r.last)
        values = pipe.execute()
        for r, data in zip(group, values):
            if data is None or len(data) != r.last - r.first + 1:
                self._lost(located, r.key)
        return values

    def _lost(self, located: pb.LocateBatchResponse, key: str) -> None:
        current = self.client.hget(located.manifest_key, "gen")
        if current is None or current.decode() != located.generation:
            raise NotFound(f"the batch at {located.manifest_key} was deleted or replaced while it was being read")
        raise DataLoss(
            f"{key} is missing from Redis or short; was it evicted? Set Redis' maxmemory-policy to noeviction"
        )
