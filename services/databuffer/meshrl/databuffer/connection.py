"""The Redis connection of the data buffer, and how Redis failures become typed errors.

`open_redis(config)` returns a client (standalone or Redis Cluster) plus the embedded
server it started when no URL was configured; `redis_errors()` wraps every store call so
that a dropped Redis is UNAVAILABLE and an out-of-memory Redis is RESOURCE_EXHAUSTED.
Used by `DataBuffer` (meshrl.databuffer.store) and the tests.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from meshrl.common.errors import ConfigError, ResourceExhausted, Unavailable
from meshrl.common.redis_connections import CONNECTION_CLASSES
from meshrl.databuffer.config import RedisConfig
from meshrl.databuffer.embedded import EmbeddedRedis
from meshrl.databuffer.redis_watchdog import RedisWatchdog

log = logging.getLogger(__name__)

TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


@dataclass
class RedisHandle:
    client: Any  # redis.Redis or redis.cluster.RedisCluster
    url: str
    embedded: EmbeddedRedis | None = None
    cluster: bool = False
    watchdog: RedisWatchdog | None = None  # restarts the embedded Redis when it dies

    def close(self) -> None:
        self.client.close()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


@contextlib.contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Maps redis-py exceptions raised inside the block to meshrl's typed errors."""
    try:
        yield
    except redis.exceptions.ClusterDownError as exc:
        raise Unavailable(f"{what}: the Redis Cluster is down ({exc}); retry once it has a quorum") from exc
    except TRANSIENT as exc:
        raise Unavailable(f"{what}: Redis is unreachable or loading ({exc}); retry within your deadline") from exc
    except redis.ResponseError as exc:
        if str(exc).startswith("OOM"):
            raise ResourceExhausted(
                f"{what}: Redis is out of memory ({exc}); consume or delete data, or give Redis more maxmemory"
            ) from exc
        raise


def _safe_url(url: str) -> str:
    """The URL without its password, for logs and messages."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


REDIS_BASE_BYTES = 64 << 20  # Redis's own memory besides the data (and a budget's tiny tests)


def open_redis(cfg: RedisConfig, budget_bytes: int | None = None) -> RedisHandle:
    """budget_bytes: the buffer's budget, which sets an embedded Redis's maxmemory (unless configured)."""
    embedded = None
    url = cfg.url
    if url is None:
        if cfg.cluster:
            raise ConfigError("redis.cluster", True, "no redis.url is set", "give the address of one cluster node")
        headroom = (budget_bytes // 4 + REDIS_BASE_BYTES) if budget_bytes else 0  # staged chunks, indexes
        maxmemory = cfg.embedded.maxmemory_bytes or (budget_bytes + headroom if budget_bytes else None)
        extra = {"maxmemory": str(maxmemory)} if maxmemory else None
        embedded = EmbeddedRedis(cfg.embedded.data_dir, appendfsync=cfg.embedded.appendfsync, extra=extra)
        embedded.start(cfg.embedded.start_timeout_seconds)
        url = embedded.url
    kwargs: dict[str, Any] = {
        "socket_timeout": cfg.socket_timeout_seconds,
        "socket_connect_timeout": cfg.connect_timeout_seconds,
        "retry": Retry(ExponentialBackoff(cap=2.0, base=0.05), cfg.retries),
        "retry_on_error": list(TRANSIENT),
        "health_check_interval": 30,
        "connection_class": CONNECTION_CLASSES[url.partition("://")[0]],
    }
    if cfg.username:
        kwargs["username"] = cfg.username
    password = cfg.password or os.environ.get(cfg.password_env)
    if password:
        kwargs["password"] = password
    try:
        if cfg.cluster:
            kwargs.pop("retry_on_error")
            kwargs.pop("health_check_interval")
            client: Any = RedisCluster.from_url(url, **kwargs)
        else:
            client = redis.Redis.from_url(url, **kwargs)
        client.ping()
    except Exception as exc:
        if embedded is not None:
            embedded.stop()
        if isinstance(exc, redis.AuthenticationError | redis.ResponseError):
            raise ConfigError(
                "redis.url", _safe_url(url), f"Redis refused the login ({exc})", "check redis.username / password"
            ) from exc
        if isinstance(exc, redis.RedisError):
            raise Unavailable(
                f"cannot reach Redis at {_safe_url(url)}: {exc}; check redis.url and that it runs"
            ) from exc
        raise
    _warn_about_eviction(client)
    watchdog = RedisWatchdog(embedded, start_timeout=cfg.embedded.start_timeout_seconds).start() if embedded else None
    return RedisHandle(client, url, embedded, cfg.cluster, watchdog)


def _warn_about_eviction(client: Any) -> None:
    """An evicting Redis could drop unconsumed data behind the budget's back: say so at start."""
    try:
        policy = client.config_get("maxmemory-policy")
    except redis.RedisError:  # CONFIG is often disabled on managed Redis
        return
    values = set(policy.values()) if isinstance(policy, dict) else set()
    if isinstance(next(iter(policy.values()), None), dict):  # cluster: one answer per node
        values = {v.get("maxmemory-policy") for v in policy.values()}
    bad = {v for v in values if v not in (None, "noeviction", b"noeviction")}
    if bad:
        log.warning(
            "Redis maxmemory-policy is %s: Redis may evict unconsumed batches; set it to noeviction",
            sorted(map(str, bad)),
        )
