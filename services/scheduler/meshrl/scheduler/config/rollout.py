"""The `rollout` section: the replicas the scheduler launches or is given, sampling, and the replica registry
the fleet follows. Part of `JobConfig` (meshrl.scheduler.config)."""

from __future__ import annotations

from typing import Literal

import pydantic

from meshrl.common.config import StrictModel

Field = pydantic.Field


class FleetRegistrySection(StrictModel):
    """Replicas deployed on their own register here; the job's fleet follows it (joins, drains, deaths)."""

    redis_url: str | None = Field(None, description="redis://host:port/db of the replica registry; unset = none")
    namespace: str = Field("meshrl", description="the replicas' registry.namespace")
    join_timeout_seconds: float = Field(120.0, gt=0, description="a newcomer's refit + verification deadline")


class RolloutSection(StrictModel):
    replicas: int = Field(1, ge=0, description="replicas launched by the scheduler (0: only `addresses`)")
    engine: Literal["transformers", "sglang", "vllm"] = "transformers"
    n: int = Field(4, ge=1, description="samples per prompt (a group)")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(32, ge=1)
    addresses: list[str] = Field(default_factory=list, description="replicas deployed independently (host:port)")
    request_timeout_seconds: float = Field(600.0, gt=0)
    max_batch_size: int = Field(64, ge=1)
    gpus_per_replica: float = Field(0.0, ge=0, description="GPUs in each replica's placement bundle")
    service_overrides: list[str] = Field(
        default_factory=list,
        description="extra `key=value` settings of the launched rollout services, e.g. engine.sglang.extra_args.tp=2",
    )
    registry: FleetRegistrySection = Field(default_factory=lambda: FleetRegistrySection())
