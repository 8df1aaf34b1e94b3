"""The `weights` section: how the trainer's weights reach the replicas (disk or a weight group, deltas, pauses
and checksums). Part of `JobConfig` (meshrl.scheduler.config); read by meshrl.scheduler.fleet.weight_sync."""

from __future__ import annotations

from typing import Literal

import pydantic

from meshrl.common.comm_backend import CommBackend
from meshrl.common.config import StrictModel

Field = pydantic.Field


class WeightsSection(StrictModel):
    transport: Literal["disk", "distributed"] = "disk"
    keep_last: int = Field(2, ge=0, description="disk versions kept (0 = all)")
    bucket_bytes: int = Field(512 << 20, ge=1 << 20)
    pause_mode: Literal["abort", "in_place"] = "in_place"
    flush_cache: Literal["every_update", "never"] = "every_update"
    timeout_seconds: float = Field(120.0, gt=0)
    verify_checksums: bool = True
    group_address: str | None = Field(
        None, description="distributed: rendezvous host of the weight group (default: the trainer's host)"
    )
    group_port: int = Field(
        0, ge=0, le=65535, description="distributed: rendezvous port on the trainer's host (0: a free one)"
    )
    backend: CommBackend = Field(
        CommBackend.AUTO,
        description="distributed: the weight group's backend; auto = nccl when the trainer and every replica hold "
        "CUDA devices (their status says), else gloo; nccl with a CPU member is refused naming this field",
    )
    protocol: Literal["auto", "meshrl", "engine"] = Field(
        "auto",
        description="distributed: engine = SGLang/vLLM workers join the group and receive natively; meshrl = each "
        "replica receives as one rank (SGLang/vLLM adapters relay a folder); auto = engine when every replica "
        "is an SGLang or vLLM server",
    )
    delta: bool = Field(
        False,
        description="after a complete version, publish only the bits that changed, on disk or over the weight "
        "group (protocol meshrl; the engines' own wire takes complete versions); the trainer keeps one more copy "
        "of the weights, and a replica that missed the base is refitted with a complete version. Off by "
        "default: bench/weights measured 2-8% of the bytes at lr 1e-6..1e-5 but more publication time where "
        "bytes are cheap (encoding is CPU-bound); turn it on when bytes cross a slow link",
    )
    max_delta_fraction: float = Field(
        0.5, gt=0, le=1, description="delta: above this share of a complete version, publish it complete"
    )
