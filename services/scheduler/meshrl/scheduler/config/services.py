"""The `services` section: the data buffer, Ray and placement (disaggregated or colocated; each side's CPU cores
on one host, cpu_placement.py), and how the scheduler reaches each peer (`PeerChannels`, also the scheduler
service's own). Part of `JobConfig`."""

from __future__ import annotations

from typing import Literal

import pydantic

from meshrl.common.config import StrictModel
from meshrl.common.grpc_channel import ChannelConfig
from meshrl.scheduler.config.cpu_placement import CpuPlacement

Field = pydantic.Field


class PeerChannels(StrictModel):
    """How the scheduler reaches each peer: TLS (ca_file, cert_file + key_file for mTLS) and auth.token_file.
    Addresses stay where they were (services.databuffer, trainer.address, rollout.addresses / registry);
    `rollout` applies to every replica."""

    databuffer: ChannelConfig = Field(default_factory=ChannelConfig)
    trainer: ChannelConfig = Field(default_factory=ChannelConfig)
    rollout: ChannelConfig = Field(default_factory=ChannelConfig)

    @pydantic.model_validator(mode="after")
    def _no_rollout_address(self) -> PeerChannels:
        if self.rollout.address:
            raise ValueError("services.channels.rollout.address: replicas come from rollout.addresses or the registry")
        return self


class ServicesSection(StrictModel):
    databuffer: str | None = Field(None, description="address of an independent data buffer (else launched)")
    redis_url: str | None = Field(None, description="Redis for the launched data buffer (else embedded)")
    ray_address: str | None = Field(None, description="an existing Ray cluster (else a local one)")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK"] = "PACK"
    placement: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description="colocated: the trainer and the replicas share one Ray bundle (its devices) and take turns "
        "(meshrl.scheduler.step.job.colocate); disaggregated: each on its own bundle",
    )
    use_ray: bool = Field(True, description="place launched services as Ray actors (else plain processes)")
    start_timeout_seconds: float = Field(180.0, gt=0)
    channels: PeerChannels = Field(default_factory=PeerChannels)
    cpu_placement: CpuPlacement | None = Field(
        None,
        description="the launched trainer and replicas each on cores of their own on this host (CPU affinity and "
        "torch threads); unset: every service may use every core",
    )

    @pydantic.model_validator(mode="after")
    def _cpu_placement_on_this_host(self) -> ServicesSection:
        if self.cpu_placement is None:
            return self
        if self.placement == "colocated":
            raise ValueError(
                "services.cpu_placement gives the trainer and the replicas cores of their own, and "
                "services.placement = 'colocated' has them share one bundle: set services.placement: "
                "disaggregated, or drop services.cpu_placement"
            )
        if self.ray_address:
            raise ValueError(
                f"services.cpu_placement pins services to this host's cores, but services.ray_address = "
                f"{self.ray_address!r} may place them on other hosts: drop services.ray_address (a local Ray or "
                "services.use_ray: false), or drop services.cpu_placement"
            )
        return self
