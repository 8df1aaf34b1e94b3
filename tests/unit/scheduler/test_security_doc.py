"""docs/security.md matches the code: it names every operator permission a job can be refused for, every job
field those permissions guard, and every setting a service's start-up warnings or refusals point to."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from meshrl.common.exposure import exposure_warnings
from meshrl.common.grpc_server import ServerConfig
from meshrl.common.path_roots import PathRoots
from meshrl.common.telemetry import TelemetryConfig
from meshrl.scheduler.config import JobConfig, SchedulerServiceConfig
from meshrl.scheduler.job_permissions import JobPermissions, _peer_fields

DOC = (Path(__file__).parents[3] / "docs" / "security.md").read_text()


def test_every_permission_and_the_fields_it_guards_are_documented():
    for name in JobPermissions.model_fields:
        assert f"`{name}`" in DOC, f"job_permissions.{name} is not in docs/security.md"
    for name in ("allowed_modules", "run_root", "job_permissions", "channels"):
        assert name in SchedulerServiceConfig.model_fields and f"`{name}`" in DOC
    cfg = JobConfig.model_validate({"model": {"path": "m"}, "data": {"train": "t"}, "rollout": {"addresses": ["h:1"]}})
    for field, _value in _peer_fields(cfg):
        documented = field.replace("services.channels.databuffer", "services.channels.*").replace(
            "services.channels.trainer", "services.channels.*"
        )
        assert documented.split("[")[0] in DOC, f"{field} is not in docs/security.md"


def test_the_settings_start_up_warnings_name_are_documented(monkeypatch):
    monkeypatch.delenv("MESHRL_AUTH_TOKEN", raising=False)
    cfg = SimpleNamespace(
        server=ServerConfig(host="0.0.0.0"),
        paths=PathRoots(roots=[]),
        telemetry=TelemetryConfig(prometheus_port=9464, prometheus_host="0.0.0.0"),
    )
    text = " ".join(exposure_warnings(cfg))
    for setting in (
        "server.auth.token_file",
        "server.require_auth",
        "server.host",
        "server.tls",
        "telemetry.prometheus_host",
        "paths.roots",
        "server.max_long_streams",
        "weights.group_address",
    ):
        assert setting in DOC, f"{setting} is not in docs/security.md"
    assert all(s in text for s in ("server.auth.token_file", "server.tls", "telemetry.prometheus_host", "paths.roots"))
