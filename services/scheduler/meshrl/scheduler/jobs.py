"""The scheduler's jobs: submit (workflow + config), run each in its own thread, follow its
events, cancel it, scale its rollout fleet. Used by the gRPC job API and by `meshrl run`; each job belongs to
its submitter's identity, and only it or an admin may act on the job (`meshrl.scheduler.job_access`).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field

import yaml

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.common.bounded_yaml import load_bounded
from meshrl.common.config import deep_merge, parse_overrides
from meshrl.common.errors import FailedPrecondition, InvalidArgument, MeshrlError, NotFound, cap_message
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.events import EventLog
from meshrl.scheduler.job_access import LOCAL, Caller, check_folder, record_owner, recorded_owner
from meshrl.scheduler.job_policy import JobPolicy, check_run_id
from meshrl.scheduler.recovery import run_with_restarts, unfinished_runs
from meshrl.scheduler.rundir import RunDir
from meshrl.scheduler.step.dag.agents import check_agent_job
from meshrl.scheduler.step.dag.dispatch import check_runnable
from meshrl.scheduler.step.job.runner import JobRunner
from meshrl.scheduler.step.pacing.modes import plan_async
from meshrl.scheduler.step.scoring.old_logprobs import resolve_old_logprobs
from meshrl.scheduler.step.scoring.reward_model import reward_model_path
from meshrl.scheduler.step.scoring.temperature import check_temperatures
from meshrl.scheduler.workflow import Workflow, load_workflow_text

log = logging.getLogger(__name__)
TERMINAL = (spb.JOB_STATE_SUCCEEDED, spb.JOB_STATE_FAILED, spb.JOB_STATE_CANCELLED)


def build_job_config(config_yaml: str, overrides: list[str]) -> tuple[JobConfig, dict]:
    from meshrl.common.config import to_config_error

    try:
        data = load_bounded(config_yaml, source="the job config") if config_yaml.strip() else {}
    except yaml.YAMLError as exc:
        raise InvalidArgument(cap_message(f"the job config is not valid YAML ({exc}); fix the file's syntax")) from None
    if not isinstance(data, dict):
        raise InvalidArgument("the job config must be a YAML mapping")
    data = deep_merge(data, parse_overrides(overrides))
    try:
        return JobConfig.model_validate(data), data
    except Exception as exc:
        import pydantic

        if isinstance(exc, pydantic.ValidationError):
            raise to_config_error(JobConfig, exc) from None
        raise


@dataclass
class JobRecord:
    job_id: str
    runner: JobRunner
    events: EventLog
    state: int = spb.JOB_STATE_PENDING
    error: str = ""
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    thread: threading.Thread | None = None
    summary: dict = field(default_factory=dict)
    last_metrics: dict = field(default_factory=dict)
    resume: bool = False
    restarts: int = 0  # services restarted after one died (recovery.run_with_restarts)
    steps_lost: int = 0  # steps redone after those restarts
    owner: str = ""  # the submitter's identity (job_access): only it or an admin may act on the job

    def to_proto(self) -> spb.Job:
        cfg = self.runner.cfg
        return spb.Job(
            job_id=self.job_id,
            state=self.state,
            step=self.runner.step,
            total_steps=cfg.job.steps,
            run_dir=str(self.runner.run.root),
            error=self.error,
            created_at=self.created_at,
            updated_at=self.updated_at,
            last_metrics={k: float(v) for k, v in self.last_metrics.items() if isinstance(v, (int, float))},
            workflow=self.runner.workflow.dag_id,
            placements=[spb.Placement(**row) for row in self._placements()],
        )

    def _placements(self) -> list[dict]:
        """Where the job's services run now (those started so far); nothing after they stopped."""
        services = self.runner.services
        return services.placements() if services is not None else []


class JobManager:
    def __init__(
        self,
        run_root: str = "runs",
        max_concurrent: int = 1,
        policy: JobPolicy | None = None,
        keep_finished: int = 100,
    ) -> None:
        """run_root: where run folders go; policy: the operator's limits on jobs (default: `meshrl run`'s
        local policy, which trusts the job's own allow-list and job.run_root); keep_finished: ended jobs kept
        in memory (their event logs) for GetJob / WatchJob, the oldest forgotten beyond it (folders stay)."""
        self.keep_finished = keep_finished
        self.policy = policy or JobPolicy.local(run_root)
        self.run_root = self.policy.run_root
        self.jobs: dict[str, JobRecord] = {}
        self.slots = threading.Semaphore(max_concurrent)
        self.lock = threading.Lock()

    def create(
        self,
        workflow_text: str,
        config_yaml: str,
        overrides: list[str],
        job_id: str = "",
        resume_dir: str = "",
        progress: bool = False,
        caller: Caller = LOCAL,
    ) -> JobRecord:
        """A new job of `caller`'s (a resume: of the run folder's submitter, which only it or an admin may
        resume)."""
        cfg, raw = build_job_config(config_yaml, overrides)
        if job_id:
            check_run_id(job_id)
        job = cfg.job.model_copy(update={"allowed_modules": self.policy.modules_for(cfg, raw)})
        cfg = cfg.model_copy(update={"job": job})
        self.policy.check_refs(cfg)  # by name, before the workflow's refs are imported
        self.policy.check_overrides(cfg)
        cfg = self.policy.check_infrastructure(cfg, raw)  # Ray, peers, channel secrets, paths, generator
        workflow: Workflow = load_workflow_text(workflow_text, raw, allowed_modules=cfg.job.allowed_modules)
        check_runnable(workflow)  # a reward-model node's settings are valid from here on
        self.policy.check_workflow_path("reward model node config.model_path", reward_model_path(workflow.nodes))
        check_agent_job(cfg, workflow.nodes, resume=bool(resume_dir))  # multi-agent jobs: what they support
        resolve_old_logprobs(cfg, workflow.nodes)  # before anything reads it
        check_temperatures(workflow.nodes, cfg.rollout.temperature)  # one per trainer call
        if cfg.training.mode != "sync":
            plan_async(cfg.training, cfg.data.prompts_per_step, workflow.nodes)  # refused now, not at step 1
        if resume_dir:
            folder = self.policy.resume_folder(resume_dir)
            submitter = recorded_owner(folder)
            caller.check(submitter, "resume", f"the run in {resume_dir!r}")
            run = RunDir(folder)
            job_id = job_id or run.root.name
        else:
            submitter = ""
            job_id = job_id or f"{cfg.job.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
            folder = self.policy.run_folder(cfg, raw, job_id)
            check_folder(folder, self.run_root, caller)  # not into another submitter's run
            run = RunDir(folder)
            run.write_config(raw, workflow_text)
        with self.lock:
            if job_id in self.jobs:
                raise InvalidArgument(f"job id {job_id!r} is taken; choose another or leave it empty")
            owner = next(
                (r for r in self.jobs.values() if r.state not in TERMINAL and r.runner.run.root == run.root), None
            )
            if owner is not None:
                raise FailedPrecondition(
                    f"run folder {run.root} belongs to job {owner.job_id}, which is "
                    f"{spb.JobState.Name(owner.state)}: two jobs would write it. Fix: cancel that job first, or "
                    "resume after it ended"
                )
            events = EventLog(job_id, run.events_file)
            record = JobRecord(
                job_id,
                JobRunner(workflow, cfg, run, job_id, events, progress),
                events,
                owner=submitter or caller.identity,
            )
            self.jobs[job_id] = record
        if not submitter:  # a new run, or one from before owners were recorded: it is the caller's now
            record_owner(run.root, record.owner)
        record.resume = bool(resume_dir)
        return record

    def run(self, record: JobRecord) -> None:
        """Runs the job in this thread; its outcome is in record.state / record.error."""
        with self.slots:
            self._set(record, spb.JOB_STATE_RUNNING, "started")
            try:
                record.summary = run_with_restarts(record, record.resume)
                self._set(record, spb.JOB_STATE_SUCCEEDED, "finished")
            except MeshrlError as exc:
                cancelled = exc.code.name == "CANCELLED"
                record.error = str(exc) if cancelled else "".join(traceback.format_exception(exc))
                self._set(record, spb.JOB_STATE_CANCELLED if cancelled else spb.JOB_STATE_FAILED, str(exc))
            except BaseException as exc:
                record.error = "".join(traceback.format_exception(exc))
                self._set(record, spb.JOB_STATE_FAILED, f"{type(exc).__name__}: {exc}")
                if isinstance(exc, KeyboardInterrupt):
                    raise
            finally:
                record.events.close()
                self._forget_finished()

    def _forget_finished(self) -> None:
        """Keeps the newest `keep_finished` ended jobs in memory; older ones' folders stay on disk."""
        with self.lock:
            ended = sorted((r for r in self.jobs.values() if r.state in TERMINAL), key=lambda r: r.updated_at)
            for record in ended[: max(0, len(ended) - self.keep_finished)]:
                del self.jobs[record.job_id]

    def start(self, record: JobRecord) -> None:
        record.thread = threading.Thread(target=self.run, args=(record,), name=f"job-{record.job_id}", daemon=True)
        record.thread.start()

    def _set(self, record: JobRecord, state: int, message: str) -> None:
        record.state = state
        record.updated_at = time.time()
        record.events.state(state, message)

    def get(self, job_id: str, caller: Caller = LOCAL, action: str = "read") -> JobRecord:
        """The job, if `caller` submitted it or is an admin (else PERMISSION_DENIED)."""
        record = self.jobs.get(job_id)
        if record is None:
            raise NotFound(
                f"no job {job_id!r}; `meshrl status` lists the jobs (ended jobs beyond the newest "
                f"{self.keep_finished} are forgotten; their run folders stay)"
            )
        caller.check(record.owner, action, f"job {job_id!r}")
        metrics = [e.metrics for e in record.events.read(0, 0)[0] if e.WhichOneof("body") == "metrics"]
        if metrics:
            record.last_metrics = dict(metrics[-1].metrics)
        return record

    def visible(self, caller: Caller = LOCAL) -> list[JobRecord]:
        """The jobs `caller` may see: its own, or every job for an admin."""
        mine = [r.job_id for r in list(self.jobs.values()) if caller.admin or r.owner == caller.identity]
        found = []
        for job_id in mine:
            try:
                found.append(self.get(job_id, caller))
            except NotFound:
                continue  # forgotten since (an ended job beyond keep_finished)
        return found

    def cancel(self, job_id: str, caller: Caller = LOCAL) -> JobRecord:
        record = self.get(job_id, caller, "cancel")
        if record.state in TERMINAL:
            raise FailedPrecondition(f"job {job_id} already ended ({spb.JobState.Name(record.state)})")
        record.runner.cancelled.set()
        return record

    def scale(self, job_id: str, service: str, replicas: int, caller: Caller = LOCAL) -> list[str]:
        record = self.get(job_id, caller, "scale")
        if service != "rollout":
            raise InvalidArgument(f"cannot scale {service!r}: only 'rollout' scales while a job runs")
        if replicas < 1:
            raise InvalidArgument(f"replicas = {replicas}: a job needs at least one rollout replica")
        if record.state != spb.JOB_STATE_RUNNING:
            raise FailedPrecondition(f"job {job_id} is not running ({spb.JobState.Name(record.state)})")
        return record.runner.request_scale(replicas)

    def recover(self) -> list[JobRecord]:
        """After a scheduler restart: resumes every job that was running in the run root (from its folder's
        config, workflow and last checkpoint). A run that cannot be resumed is reported and skipped."""
        records = []
        for folder in unfinished_runs(self.run_root):
            try:
                config = (folder / "config.yaml").read_text()
                record = self.create((folder / "workflow.yaml").read_text(), config, [], resume_dir=str(folder))
            except MeshrlError as exc:
                log.warning("cannot resume the run in %s: %s", folder, exc)
                continue
            record.events.log("the scheduler restarted: resuming this run from its last checkpoint")
            self.start(record)
            records.append(record)
        return records
