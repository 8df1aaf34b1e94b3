"""What a job may do on the scheduler's host: which modules its code may come from, where its run folder
may live, which service settings it may override, and (meshrl.scheduler.job_permissions) which infrastructure
fields it may set. The operator sets all of them in the scheduler's own config; a submitted job may only narrow
them, and its channels to peers are the operator's (`channels`).

`JobManager` applies the policy to every job before anything of the job runs: the allow-list check is by
name (nothing is imported until every ref passes), run ids are checked, and run / resume folders must resolve
inside the run root. `JobPolicy.local()` is `meshrl run` on one's own machine: the job's config is trusted
(its own allow-list and run root), which keeps the local command convenient.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from meshrl.common.errors import InvalidArgument, NotFound, PermissionDenied
from meshrl.scheduler.config import JobConfig, PeerChannels
from meshrl.scheduler.job_permissions import SETTING, JobPermissions, check_job, check_read_path
from meshrl.scheduler.workflow.executables import ALLOW_ALL, check_executable, module_allowed

# What a submitted job's service_overrides may set on the services it launches (operator mode): sizes and
# memory, never what runs or where it binds, reads or loads code from (an engine flag such as --host,
# --worker-cls or --trust-remote-code, an attention kernel from the Hub, an interpreter, a root, an address).
SAFE_ENGINE_ARGS = {
    "sglang": (
        "mem_fraction_static",
        "chunked_prefill_size",
        "max_running_requests",
        "max_total_tokens",
        "cuda_graph_max_bs",
        "disable_cuda_graph",
        "schedule_conservativeness",
        "tp_size",
    ),
    "vllm": (
        "gpu_memory_utilization",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "kv_cache_memory_bytes",
        "enable_prefix_caching",
        "block_size",
        "tensor_parallel_size",
    ),
}
SAFE_OVERRIDES = (
    *(f"engine.{engine}.extra_args.{arg}" for engine, args in SAFE_ENGINE_ARGS.items() for arg in args),
    *(f"engine.transformers.{k}" for k in ("max_admit_per_step", "max_prefill_tokens", "prefix_cache_tokens")),
    "engine.transformers.num_threads",
    "engine.transformers.dtype",
    "engine.max_batch_size",
    "engine.context_length",
    "engine.dtype",
    "defaults.",
    "torch_threads",
    "atomic_steps",
)
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def check_run_id(job_id: str) -> str:
    """A run id names one folder under the run root: letters, digits, `_.-`, no separators, not `.`/`..`."""
    if not RUN_ID.match(job_id) or job_id in (".", ".."):
        shown = job_id if len(job_id) <= 80 else job_id[:80] + "..."
        raise InvalidArgument(
            f"job id {shown!r} is not a valid run id: use 1-128 letters, digits, '_', '.' or '-' "
            "(starting with a letter or digit), or leave it empty",
            field="job_id",
        )
    return job_id


def narrows(prefix: str, allowed: Sequence[str]) -> bool:
    """True when every module `prefix` allows is also allowed by `allowed` ("*" only under "*")."""
    prefix = prefix.strip().rstrip(".")
    if prefix == ALLOW_ALL:
        return ALLOW_ALL in allowed
    return module_allowed(prefix, allowed)


def inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class JobPolicy:
    """allowed_modules: the operator's allow-list (None: trust each job's own list, `meshrl run` only).
    run_root: the folder that holds one folder per run; `trust_job_run_root`: a job's job.run_root wins."""

    allowed_modules: tuple[str, ...] | None
    run_root: Path
    trust_job_run_root: bool = False
    permissions: JobPermissions = dataclasses.field(default_factory=JobPermissions)
    channels: PeerChannels | None = None  # the operator's TLS and tokens to peers (None: the job's own)

    @classmethod
    def local(cls, run_root: str | Path = "runs") -> JobPolicy:
        return cls(None, Path(run_root), trust_job_run_root=True)

    @classmethod
    def operator(
        cls,
        allowed_modules: Sequence[str],
        run_root: str | Path,
        permissions: JobPermissions | None = None,
        channels: PeerChannels | None = None,
    ) -> JobPolicy:
        return cls(
            tuple(allowed_modules), Path(run_root), False, permissions or JobPermissions(), channels or PeerChannels()
        )

    def check_infrastructure(self, cfg: JobConfig, raw: dict) -> JobConfig:
        """Operator mode: refuses infrastructure fields the operator's job_permissions do not allow, and gives
        the job the operator's TLS and tokens to its peers. Returns the config the job runs with."""
        if self.allowed_modules is None:
            return cfg
        check_job(cfg, raw, self.run_root, self.permissions)
        if self.channels is not None:
            for peer in ("databuffer", "trainer", "rollout"):
                ours = getattr(self.channels, peer)
                theirs = getattr(cfg.services.channels, peer)
                setattr(cfg.services.channels, peer, theirs.model_copy(update={"tls": ours.tls, "auth": ours.auth}))
        return cfg

    def modules_for(self, cfg: JobConfig, raw: dict) -> list[str]:
        """The allow-list the job runs under: the operator's, or the job's own when it only narrows it."""
        if self.allowed_modules is None:
            return list(cfg.job.allowed_modules)
        job_section = raw.get("job") if isinstance(raw.get("job"), dict) else {}
        if "allowed_modules" not in job_section:
            return list(self.allowed_modules)
        wider = [p for p in cfg.job.allowed_modules if not narrows(p, self.allowed_modules)]
        if wider:
            shown = ", ".join(self.allowed_modules) or "(none)"
            raise PermissionDenied(
                f"config field 'job.allowed_modules' = {wider!r} widens the scheduler's allow-list [{shown}]. "
                "Fix: a job may only narrow it; ask the operator to add the module to the scheduler's "
                "allowed_modules, or drop it from the job",
                field="job.allowed_modules",
            )
        return list(cfg.job.allowed_modules)

    def check_refs(self, cfg: JobConfig) -> None:
        """The job's own refs (reward, data generator) against its allow-list, by name: nothing is imported."""
        refs = {"algorithm.reward": cfg.algorithm.reward if ":" in cfg.algorithm.reward else None}
        refs["data.generator"] = cfg.data.generator
        for field, ref in refs.items():
            if ref is None:
                continue
            problem = check_executable(ref, cfg.job.allowed_modules, field, import_module=False)
            if problem is not None:
                raise PermissionDenied(f"config field '{field}': {problem.message}. Fix: {problem.fix}", field=field)

    def check_workflow_path(self, field: str, path: str | None) -> None:
        """Operator mode: a path a workflow node makes a service read (the reward model) obeys read_roots."""
        if self.allowed_modules is not None and path:
            check_read_path(field, path, self.run_root, self.permissions)

    def check_overrides(self, cfg: JobConfig) -> None:
        """Under an operator, a job's `service_overrides` may tune the launched services (engine sizes and server
        flags, trainer defaults) but not what they run or where they read and write (interpreters, environment,
        path roots, addresses, log files): those belong to the operator's service config."""
        if self.allowed_modules is None:
            return
        for section, overrides in (
            ("rollout", cfg.rollout.service_overrides),
            ("trainer", cfg.trainer.service_overrides),
        ):
            for item in overrides:
                key = item.split("=", 1)[0].strip().replace("-", "_")
                if not key.startswith(SAFE_OVERRIDES + tuple(self.permissions.service_overrides)):
                    raise PermissionDenied(
                        f"config field '{section}.service_overrides' sets {key!r}, which a submitted job may not "
                        f"change. Fix: set it in the {section} service's own config, use a tuning key (engine "
                        f"sizes, memory, defaults.*; meshrl.scheduler.job_policy.SAFE_OVERRIDES), or ask the "
                        f"operator to add its prefix to the scheduler's {SETTING}.service_overrides",
                        field=f"{section}.service_overrides",
                    )

    def run_folder(self, cfg: JobConfig, raw: dict, job_id: str) -> Path:
        """The new run's folder: <run root>/<job id>, refused when it would fall outside the run root."""
        check_run_id(job_id)
        job_section = raw.get("job") if isinstance(raw.get("job"), dict) else {}
        root = self.run_root
        if "run_root" in job_section:
            asked = Path(cfg.job.run_root)
            if self.trust_job_run_root:
                root = asked
            elif inside(asked if asked.is_absolute() else self.run_root / asked, self.run_root):
                root = asked if asked.is_absolute() else self.run_root / asked
            else:
                raise PermissionDenied(
                    f"config field 'job.run_root' = {cfg.job.run_root!r} is outside the scheduler's run root "
                    f"{str(self.run_root)!r}. Fix: leave it unset or name a folder inside the run root",
                    field="job.run_root",
                )
        folder = root / job_id
        if not inside(folder, root):
            raise InvalidArgument(f"job id {job_id!r} leaves the run root", field="job_id")
        return folder

    def resume_folder(self, resume_dir: str) -> Path:
        """An existing run folder to resume: it must hold the run's config (and lie inside the run root)."""
        folder = Path(resume_dir)
        if not self.trust_job_run_root:
            folder = folder if folder.is_absolute() else self.run_root / folder
            if not inside(folder, self.run_root):
                raise PermissionDenied(
                    f"resume folder {resume_dir!r} is outside the scheduler's run root {str(self.run_root)!r}. "
                    "Fix: name a run folder under the run root",
                    field="resume_run_dir",
                )
        if not (folder / "config.yaml").is_file():
            raise NotFound(
                f"resume folder {resume_dir!r} is not a run folder (no config.yaml there). "
                "Fix: pass the folder `meshrl run` printed as 'run folder:'",
                field="resume_run_dir",
            )
        return folder
