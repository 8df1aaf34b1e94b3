"""`SchedulerServiceConfig`: the job API server's own settings (`python -m meshrl.scheduler`): its server, run
root, limits, and the operator's rules for submitted jobs (allowed modules, permissions, peer channels, access)."""

from __future__ import annotations

import pydantic

from meshrl.common.config import StrictModel
from meshrl.common.grpc_server import ServerConfig
from meshrl.common.telemetry import TelemetryConfig
from meshrl.scheduler.config.services import PeerChannels
from meshrl.scheduler.job_access import JobAccess
from meshrl.scheduler.job_permissions import JobPermissions

Field = pydantic.Field


class SchedulerServiceConfig(StrictModel):
    """`python -m meshrl.scheduler`: the job API server."""

    server: ServerConfig = Field(default_factory=lambda: ServerConfig(port=50050))
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    run_root: str = Field("runs", description="every run folder lies under it; a job may name a sub-folder only")
    max_concurrent_jobs: int = Field(1, ge=1)
    keep_finished_jobs: int = Field(
        100,
        ge=0,
        description="ended jobs kept in memory (event logs) for GetJob / WatchJob; older ones are "
        "forgotten, their run folders stay",
    )
    recover_jobs: bool = Field(True, description="on start, resume the jobs that were running in run_root")
    allowed_modules: list[str] = Field(
        default_factory=lambda: ["meshrl"],
        description="the operator's allow-list: module prefixes a submitted job's executable_refs, rewards and "
        "data generators may come from (a job's job.allowed_modules may only narrow it; '*' allows any)",
    )
    job_permissions: JobPermissions = Field(
        default_factory=JobPermissions,
        description="infrastructure fields a submitted job may set (Ray cluster, peer addresses, paths outside "
        "the run root, data generators, tracking URIs, further service overrides); empty lists allow none",
    )
    channels: PeerChannels = Field(
        default_factory=PeerChannels,
        description="TLS and tokens the scheduler uses to reach every job's peers; a job may not set its own",
    )
    job_access: JobAccess = Field(
        default_factory=JobAccess,
        description="who may act on which job: named submitter tokens (each an identity, like a client "
        "certificate's common name) act only on their own jobs; job_access.admins on every job",
    )
