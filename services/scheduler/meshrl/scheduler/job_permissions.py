"""What a submitted job may set beyond tuning: the infrastructure fields of a job config (the Ray cluster, the
addresses the scheduler dials with its tokens, the paths it reads and writes, the data generator it calls) and
the operator's `job_permissions` that allow them.

`JobPolicy.check_infrastructure` runs `check_job` on every job submitted to the scheduler service (operator
mode) before anything of the job runs; each refusal is PERMISSION_DENIED naming the job's field and the
`job_permissions.*` setting of the scheduler's config that would allow it. `meshrl run` trusts its own config.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pydantic

from meshrl.common.config import StrictModel
from meshrl.common.errors import PermissionDenied
from meshrl.scheduler.workflow.executables import module_allowed

if TYPE_CHECKING:
    from meshrl.scheduler.config import JobConfig

SETTING = "job_permissions"  # the section of the scheduler service's config


class JobPermissions(StrictModel):
    """The operator's exceptions to "a job only tunes": each list is empty by default (nothing is allowed)."""

    ray_addresses: list[str] = pydantic.Field(
        default_factory=list, description="Ray clusters a job may name in services.ray_address"
    )
    peer_addresses: list[str] = pydantic.Field(
        default_factory=list,
        description="addresses a job may name for its peers, exactly as written (host:port, redis://...): "
        "services.databuffer / redis_url / channels.*.address, trainer.address, rollout.addresses, "
        "rollout.registry.redis_url, weights.group_address; the scheduler dials them with its own tokens",
    )
    read_roots: list[str] = pydantic.Field(
        default_factory=list,
        description="folders besides the run root that a job's model.path, data.train and data.eval may read",
    )
    write_roots: list[str] = pydantic.Field(
        default_factory=list,
        description="folders besides the run root that a job may write (model.path with model.build, the data "
        "a data.generator writes, tracker folders); they are readable too. `meshrl up` sets its working folder",
    )
    data_generators: list[str] = pydantic.Field(
        default_factory=list,
        description="data.generator refs a job may call: 'package.module:function', or a module prefix whose "
        "functions are all meant for it (the allow-list `meshrl` also holds helpers that delete folders)",
    )
    tracking_uris: list[str] = pydantic.Field(
        default_factory=list, description="logging.mlflow_tracking_uri values a job may set"
    )
    service_overrides: list[str] = pydantic.Field(
        default_factory=list,
        description="further key prefixes a job's rollout/trainer.service_overrides may set (beyond the tuning "
        "keys in meshrl.scheduler.job_policy.SAFE_OVERRIDES), e.g. engine.vllm.extra_args.enable_lora",
    )


def _denied(field: str, value: object, why: str, setting: str, fix: str = "leave it unset") -> PermissionDenied:
    shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:200] + "..."
    return PermissionDenied(
        f"config field '{field}' = {shown} {why}. Fix: {fix}, or ask the operator to allow it in the "
        f"scheduler's config under {SETTING}.{setting}",
        field=field,
    )


def _inside(path: str, roots: list[Path]) -> bool:
    resolved = Path(path).expanduser().resolve()
    return any(resolved == root or root in resolved.parents for root in roots)


def _peer_fields(cfg: JobConfig) -> Iterator[tuple[str, str | None]]:
    s = cfg.services
    yield "services.databuffer", s.databuffer
    yield "services.redis_url", s.redis_url
    yield "services.channels.databuffer.address", s.channels.databuffer.address
    yield "services.channels.trainer.address", s.channels.trainer.address
    yield "trainer.address", cfg.trainer.address
    for i, address in enumerate(cfg.rollout.addresses):
        yield f"rollout.addresses[{i}]", address
    yield "rollout.registry.redis_url", cfg.rollout.registry.redis_url
    yield "weights.group_address", cfg.weights.group_address


def _channel_secrets(raw: dict) -> Iterator[str]:
    """The job's own `services.channels.<peer>.tls / auth` (files and variables the scheduler would read)."""
    services = raw.get("services") if isinstance(raw.get("services"), dict) else {}
    channels = services.get("channels") if isinstance(services.get("channels"), dict) else {}
    for peer, section in channels.items():
        if isinstance(section, dict):
            yield from (f"services.channels.{peer}.{key}" for key in ("tls", "auth") if section.get(key) is not None)


def generator_allowed(ref: str, allowed: list[str]) -> bool:
    module = ref.split(":", 1)[0]
    return ref in allowed or any(":" not in entry and module_allowed(module, [entry]) for entry in allowed)


def check_job(cfg: JobConfig, raw: dict, run_root: Path, permissions: JobPermissions) -> None:
    """Refuses (PermissionDenied) the first infrastructure field the operator's permissions do not allow."""
    address = cfg.services.ray_address
    if address and address not in permissions.ray_addresses:
        raise _denied(
            "services.ray_address", address, "names a Ray cluster the scheduler would join (and trust)", "ray_addresses"
        )
    for field, value in _peer_fields(cfg):
        if value and value not in permissions.peer_addresses:
            raise _denied(
                field, value, "is an address the scheduler would dial with its own credentials", "peer_addresses"
            )
    for field in _channel_secrets(raw):
        raise PermissionDenied(
            f"config field '{field}' is set: a submitted job may not choose the TLS files or the token (file or "
            "environment variable) the scheduler sends to its peers. Fix: drop it from the job; the operator "
            "sets them in the scheduler's config under `channels`",
            field=field,
        )
    generator = cfg.data.generator
    if generator and not generator_allowed(generator, permissions.data_generators):
        raise _denied("data.generator", generator, "is not a data generator the operator allows", "data_generators")
    uri = cfg.logging.mlflow_tracking_uri
    if uri and uri not in permissions.tracking_uris:
        raise _denied(
            "logging.mlflow_tracking_uri", uri, "is a tracking store the scheduler would write to", "tracking_uris"
        )
    _check_paths(cfg, run_root.resolve(), permissions)


def check_read_path(field: str, path: str, run_root: Path, permissions: JobPermissions) -> None:
    """A folder the job makes a service read (a workflow's reward model): inside the run root or a read/write root."""
    roots = [
        run_root.resolve(),
        *(Path(r).expanduser().resolve() for r in [*permissions.write_roots, *permissions.read_roots]),
    ]
    if not _inside(path, roots):
        raise _denied(
            field,
            path,
            f"lies outside the run root {str(run_root)!r} and every folder the operator lets jobs read",
            "read_roots",
            "name a path inside the run root",
        )


def _check_paths(cfg: JobConfig, run_root: Path, permissions: JobPermissions) -> None:
    """Written paths stay inside the run root or a write root; read paths inside those or a read root."""
    writable = [run_root, *(Path(r).expanduser().resolve() for r in permissions.write_roots)]
    written = {
        "model.path": cfg.model.path if cfg.model.build is not None else None,  # built there when missing
        "data.train": cfg.data.train if cfg.data.generator else None,  # the generator writes its folder
        "data.eval": cfg.data.eval if cfg.data.generator else None,
        "logging.tensorboard_dir": cfg.logging.tensorboard_dir,
        "logging.wandb_dir": cfg.logging.wandb_dir,
    }
    for field, path in written.items():
        if path and not _inside(path, writable):
            raise _denied(
                field,
                path,
                f"is written by the job and lies outside the scheduler's run root {str(run_root)!r}",
                "write_roots",
                "name a folder inside the run root",
            )
    for field, path in (("model.path", cfg.model.path), ("data.train", cfg.data.train), ("data.eval", cfg.data.eval)):
        if path:
            check_read_path(field, path, run_root, permissions)
