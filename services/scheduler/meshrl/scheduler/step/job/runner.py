"""Runs one job from start to end: prepare the model and data, bring the services up, a
supervised warm-up if configured, the step-0 evaluation, then the training steps

    data_load → rollout → reward → advantage → old/ref log-prob → train → publish weights

(or, with `training.mode` one_step_off / async, the generation side running ahead in a producer thread:
step/pacing/pipeline.py) with evaluation every K steps, checkpoints, metrics, a report; and everything shut down
at the end, on failure, on cancel or on Ctrl-C. A run folder can be resumed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from meshrl.common import telemetry
from meshrl.common.errors import Cancelled, InvalidArgument, MeshrlError
from meshrl.common.telemetry import attributes as A
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.events import EventLog
from meshrl.scheduler.fleet.weight_sync import WeightPublisher
from meshrl.scheduler.launch.services import JobServices
from meshrl.scheduler.report import write_report
from meshrl.scheduler.rundir import RunDir
from meshrl.scheduler.step.dag.agents import agents_of
from meshrl.scheduler.step.dag.executor import StepExecutor
from meshrl.scheduler.step.dag.nodes import NodeHandlers
from meshrl.scheduler.step.job.agent_runner import AgentJob
from meshrl.scheduler.step.job.colocate import Turns
from meshrl.scheduler.step.job.deletions import StepDeletions
from meshrl.scheduler.step.job.evaluation import evaluate
from meshrl.scheduler.step.job.fleet_changes import FleetChanges
from meshrl.scheduler.step.job.job_inputs import JobInputs, prepare_job, read_job_inputs
from meshrl.scheduler.step.job.progress import StepProgress
from meshrl.scheduler.step.job.warmup import SupervisedWarmup, heldout_pairs
from meshrl.scheduler.step.pacing.pipeline import SyncSteps, make_steps
from meshrl.scheduler.step.prompts.data import DataPosition, PromptEncoder, PromptSampler, load_records
from meshrl.scheduler.step.scoring.reward_model import load_reward_model, reward_model_path
from meshrl.scheduler.step.scoring.rewards import resolve_reward
from meshrl.scheduler.step.user.user_code import UserCode
from meshrl.scheduler.trackers import Trackers, open_trackers

log = logging.getLogger(__name__)


@dataclass
class JobState:
    """What a checkpoint adds to the trainer's: the step, data position and weight version."""

    step: int = 0
    weight_version: int = 0
    data: str = ""
    warmup_done: bool = False

    @classmethod
    def read(cls, path: Path) -> JobState:
        return cls(**json.loads((path / "job_state.json").read_text()))


class JobRunner:
    def __init__(self, workflow, cfg: JobConfig, run: RunDir, job_id: str, events: EventLog, progress: bool = True):
        self.workflow = workflow
        self.cfg = cfg
        self.run = run
        self.job_id = job_id
        self.events = events
        self.show_progress = progress
        self.cancelled = threading.Event()
        self.step = 0
        self.trackers = Trackers()  # opened by run_job (logging.backends)
        self.scaling = FleetChanges(cfg, events)  # `meshrl scale` and the registry, between steps
        self.user_code: UserCode | None = None  # worker pools for rewards and environments, made by run_job
        self._steps: SyncSteps | None = None  # how steps run (training.mode); asynchronous ones run ahead
        self.turns: Turns | None = None  # colocated mode's order of sleeping and waking (services.placement)
        self.services: JobServices | None = None  # the running services (None before they start and once stopped)
        self.roles = sorted(
            {str(n.node_role).lower() for n in workflow.nodes if str(n.node_role) in ("ACTOR", "REFERENCE", "CRITIC")}
            | {"actor"}
        )

    # -- checkpoints ---------------------------------------------------------------------
    def save_checkpoint(self, svc: JobServices, publisher: WeightPublisher, sampler: PromptSampler) -> None:
        path = self.run.checkpoint_path(self.step)
        data = (self._steps.data_position() if self._steps else "") or sampler.position.to_json()
        with self.turns.trainer_only() if self.turns else contextlib.nullcontext():
            for role in self.roles:
                svc.trainer.save_checkpoint(role, str(path / role), self.step, data.encode())
        state = JobState(self.step, publisher.version, data, warmup_done=True)
        self.run.mark_checkpoint(path, state.__dict__)  # durably, COMPLETE last
        self.events.log(f"checkpoint saved at step {self.step}: {path}")

    def restore(self, svc: JobServices, publisher: WeightPublisher, sampler: PromptSampler) -> bool:
        path = self.run.latest_checkpoint()
        if path is None:
            return False
        state = JobState.read(path)
        for role in self.roles:
            svc.trainer.load_checkpoint(role, str(path / role))
        self.step = state.step
        sampler.position = DataPosition.from_json(state.data)
        publisher.version = max([state.weight_version, *self.run.published_versions()])
        self.run.truncate_after(self.step)
        self.events.log(f"resumed from {path} at step {self.step}")
        return True

    # -- phases --------------------------------------------------------------------------
    def warmup(self, svc: JobServices, job: JobInputs, publisher: WeightPublisher) -> None:
        cfg = self.cfg
        mbt, seed = cfg.trainer.micro_batch_tokens, cfg.data.shuffle_seed

        def accuracy() -> dict[str, float]:  # the replicas get the actor's weights as they are now, then greedy eval
            self._serve_trainer_weights(svc, publisher)
            return self._evaluate(svc, job.encoder, job.eval_records, job.reward_fn)

        phase = SupervisedWarmup(
            self.job_id,
            cfg.warmup,
            svc.trainer,
            svc.buffer,
            job.encoder,
            log=self.events.log,
            micro_batch_tokens=mbt,
            shuffle_seed=seed,
            evaluate=accuracy if job.eval_records else None,
        )
        phase.run(job.records, heldout_pairs(cfg.data), self.run.root / "warmup.jsonl")
        phase.hand_over(cfg.model.path, cfg.model.dtype, cfg.trainer.optimizer, cfg.job.seed)
        if "reference" in self.roles:
            svc.trainer.load_model("reference", self.cfg.model.path, self.cfg.model.dtype, None, 0, copy_from="actor")

    def _eval(self, svc, encoder, eval_records, reward_fn) -> dict[str, float]:
        """The held-out evaluation at this step, logged to eval.jsonl, the events and the trackers."""
        if not eval_records:
            return {}
        metrics = self._evaluate(svc, encoder, eval_records, reward_fn)
        self.run.log_eval(self.step, metrics)
        self.events.metrics(self.step, metrics)
        self.trackers.log(self.step, metrics)
        return metrics

    def _evaluate(self, svc, encoder, eval_records, reward_fn) -> dict[str, float]:
        """Greedy answers to the held-out prompts from the replicas as they serve now, scored."""
        max_tokens = self.cfg.eval.max_tokens or self.cfg.rollout.max_tokens
        if self.user_code is not None and self.user_code.env_node is not None:  # multi-turn: greedy episodes
            session = f"{self.job_id}/{self.step}/eval"
            metrics = self.user_code.evaluate_episodes(svc.fleet.router, encoder, eval_records, session)
        else:
            metrics = evaluate(
                self.job_id, self.step, eval_records, encoder, svc.buffer, svc.fleet, reward_fn, max_tokens
            )
        return metrics

    # -- the job -------------------------------------------------------------------------
    def run_job(self, resume: bool = False) -> dict:
        """The whole job (the loop in the module docstring); returns its summary. Services are shut down
        whatever happens (`shut_down`)."""
        if agents_of(self.workflow.nodes):  # one trainer and fleet per agent (step/job/agent_runner.py)
            return AgentJob(self).run(resume)
        cfg = self.cfg
        prepare_job(self.workflow, cfg, self.events.log)
        job = read_job_inputs(cfg)
        rm_path = reward_model_path(self.workflow.nodes)  # the trainer may read it (its paths.roots)
        svc = JobServices(
            cfg,
            self.run,
            cfg.model.path,
            extra_roots=(rm_path,) if rm_path else (),
            on_exit=self.events.log,
            workflow=self.workflow,
            on_event=self.events.log,
        )
        self.services = svc  # where they run, for GetJob (JobServices.placements)
        svc.place_job_thread()  # services.cpu_placement: the reward workers start on the cores of `others`
        self.user_code = UserCode(cfg, self.workflow.nodes, self.events.log)
        summary: dict = {"job_id": self.job_id, "run_dir": str(self.run.root)}
        started = time.monotonic()
        self._steps = None
        self.trackers = open_trackers(cfg.logging, self.run.root, self.job_id, cfg.model_dump(mode="json"))
        try:
            publisher, resumed = self._bring_up(svc, job, resume)
            if not resumed:
                summary["eval_step0"] = self._eval(svc, job.encoder, job.eval_records, job.reward_fn).get(
                    "eval/accuracy"
                )
            self._run_steps(svc, job, publisher)
            final = self._eval(svc, job.encoder, job.eval_records, job.reward_fn)
            if self.run.latest_checkpoint() != self.run.checkpoint_path(self.step):
                self.save_checkpoint(svc, publisher, job.sampler)
            summary.update(final_eval=final.get("eval/accuracy"), steps=self.step, weight_version=publisher.version)
            return summary
        finally:
            summary["seconds"] = round(time.monotonic() - started, 1)
            self.shut_down(svc, summary)

    def _bring_up(self, svc: JobServices, job: JobInputs, resume: bool) -> tuple[WeightPublisher, bool]:
        """Services up, models loaded, a checkpoint restored or the warm-up run, and the replicas serving
        exactly the trainer's weights. Returns the publisher and whether a checkpoint was restored."""
        cfg = self.cfg
        svc.open()
        self.events.log(f"services up: {svc.addresses}")
        if cfg.services.placement == "colocated":  # the replicas sleep until the first publication
            self.turns = Turns(svc.fleet.clients, svc.trainer)
            self.events.log(f"colocated on one bundle: {svc.shared_bundle()}")
            self.turns.sleep_replicas()
        for role in self.roles:
            opt = cfg.trainer.critic_optimizer if role == "critic" else cfg.trainer.optimizer
            svc.trainer.load_model(
                role,
                cfg.model.path,
                cfg.model.dtype,
                opt,
                cfg.job.seed,
                gradient_checkpointing=cfg.trainer.gradient_checkpointing,
            )
        load_reward_model(svc.trainer, self.workflow.nodes, cfg.model.dtype, cfg.job.seed)
        publisher = WeightPublisher(svc.trainer, cfg.weights, str(self.run.weights))
        resumed = resume and self.restore(svc, publisher, job.sampler)
        if not resumed and (cfg.warmup.steps or cfg.warmup.epochs):
            self.warmup(svc, job, publisher)
        self._serve_trainer_weights(svc, publisher)
        return publisher, resumed

    def _serve_trainer_weights(self, svc: JobServices, publisher: WeightPublisher) -> None:
        """Makes the replicas serve exactly the trainer's weights before anything is generated. They may have
        served another job: the version starts above every one they report (and above those published before a
        restart with no checkpoint yet)."""
        served = [c.status().weight_version for c in svc.fleet.clients()]
        publisher.version = max([publisher.version, *served, *self.run.published_versions()])
        svc.fleet.expect_version(self._publish(svc, publisher).version)

    def _run_steps(self, svc: JobServices, job: JobInputs, publisher: WeightPublisher) -> None:
        """The training steps up to job.steps: scaling and registry changes between steps, evaluation and
        checkpoints at their intervals."""
        cfg = self.cfg
        handlers = NodeHandlers(
            cfg, svc.buffer, svc.trainer, svc.fleet, job.encoder, job.sampler, job.reward_fn, self.user_code
        )
        handler_for = self.turns.wrap(handlers.handler_for) if self.turns else handlers.handler_for
        executor = StepExecutor(self.workflow.nodes, handler_for, self.events)
        steps = self._steps = make_steps(
            cfg,
            executor,
            svc.buffer,
            self.job_id,
            self.workflow.nodes,
            self.cancelled,
            lambda: job.sampler.position.to_json(),
            requeue=job.sampler.put_back,
        )
        steps.start(self.step, publisher.version)
        # the last step's batches are gone before the job reports its end (StepDeletions.__exit__)
        with (
            StepDeletions(svc.buffer, self.job_id) as deletions,
            StepProgress(cfg.job.steps, self.step, self.show_progress) as bar,
        ):
            while self.step < cfg.job.steps:
                if self.cancelled.is_set():
                    raise Cancelled(f"job {self.job_id} cancelled at step {self.step}")
                self.scaling.apply(svc, publisher, colocated=self.turns is not None)
                self.scaling.follow_registry(svc, publisher)
                self.step += 1
                metrics = self._train_step(svc, steps, publisher, deletions)
                if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.job.steps:
                    deletions.wait()  # the evaluation writes under this step's keys
                    metrics.update(self._eval(svc, job.encoder, job.eval_records, job.reward_fn))
                steps.announce(publisher.version)  # generation may move on to the new weights
                bar.step(self.step, metrics)
                if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                    self.save_checkpoint(svc, publisher, job.sampler)

    def shut_down(self, svc: JobServices, summary: dict) -> None:
        """Stops the steps and the services (the producer before the user-code workers its reward nodes use),
        flushes telemetry and writes the report and the trackers' end."""
        steps = self._steps
        if steps is not None:
            steps.stop()
        self.services = None
        svc.close()
        if steps is not None:
            steps.join()
            steps.executor.close()
        self.user_code.close()
        telemetry.force_flush()
        if self.run.metrics_file.exists():
            write_report(self.run, summary)
        self.trackers.finish(self.step, sorted(self.run.plots.glob("*.png")))

    # -- scaling ---------------------------------------------------------------------------
    def request_scale(self, replicas: int, timeout: float = 900.0) -> list[str]:
        """Asks the step loop to resize the rollout fleet before its next step; returns the replicas."""
        return self.scaling.request(replicas, timeout)

    def run_eval_only(self, checkpoint: str | None = None) -> dict[str, float]:
        """`meshrl run --val-only`: evaluates the model (or a checkpoint's actor) on the held-out set."""
        cfg = self.cfg
        prepare_job(self.workflow, cfg, self.events.log)
        if not cfg.data.eval:
            raise InvalidArgument("--val-only needs data.eval: a held-out set to evaluate")
        records = load_records(cfg.data.eval, cfg.data.prompt_key, cfg.data.answer_key)[: cfg.eval.max_prompts]
        encoder = PromptEncoder(cfg.model.path, cfg.data.apply_chat_template, cfg.data.system_prompt)
        svc = JobServices(cfg, self.run, cfg.model.path, extra_roots=(checkpoint,) if checkpoint else ())
        self.user_code = UserCode(cfg, self.workflow.nodes, self.events.log)  # episodes, for an environment
        try:
            svc.open()
            if checkpoint:
                svc.trainer.load_model("actor", cfg.model.path, cfg.model.dtype, None, cfg.job.seed)
                self.step = svc.trainer.load_checkpoint("actor", str(Path(checkpoint) / "actor")).step
                WeightPublisher(svc.trainer, cfg.weights, str(self.run.weights)).publish(svc.fleet.clients())
            return self._eval(svc, encoder, records, resolve_reward(cfg.algorithm.reward, cfg.job.allowed_modules))
        finally:
            self.user_code.close()
            svc.close()

    def _refit_stale(self, svc: JobServices, publisher: WeightPublisher) -> None:
        """A stale replica that answers again is refitted (disk) to the current version before it serves."""
        for client in svc.fleet.stale():
            try:
                client.status(timeout=2.0)
                publisher.refit_from_disk(client)
            except MeshrlError as exc:
                self.events.log(f"replica {client.address} still stale: {exc}")
                continue
            svc.fleet.mark_fresh(client.address)
            self.events.log(f"replica {client.address} refitted to weight version {publisher.version}")

    def _publish(self, svc: JobServices, publisher: WeightPublisher):
        """Publishes the trainer's weights to the fleet; colocated, inside the publication turn (colocate.py)."""
        if self.turns is None:
            return publisher.publish(svc.fleet.clients())
        return self.turns.publish(lambda: publisher.publish(svc.fleet.clients()))

    def _train_step(
        self, svc: JobServices, steps: SyncSteps, publisher: WeightPublisher, deletions: StepDeletions
    ) -> dict[str, float]:
        start = time.perf_counter()
        with steps.step_span(self.step) as span:
            span.set_attribute(A.STEP, self.step)
            self._refit_stale(svc, publisher)
            metrics = steps.run_step(self.step, publisher.version)
            result = self._publish(svc, publisher)
            if self.turns is not None:
                metrics.update(self.turns.metrics())
            if self.cfg.training.staleness == 0:  # else generation may lag; a replica below the job's
                svc.fleet.expect_version(result.version)  # first version (restarted) is still refused
            svc.fleet.after_publication(result.version, result.stale, self.events.log)
            metrics.update(deletions.delete(self.step))
        metrics.update(
            {
                "weights/version": result.version,
                "weights/seconds": result.seconds,
                "weights/bytes": result.bytes,
                "weights/stale_replicas": len(result.stale),
                "weights/nccl": float(result.backend == "nccl"),
            }
        )
        metrics["time/step"] = time.perf_counter() - start
        steps.finish_step(metrics)
        self.log_step(metrics)
        return metrics

    def log_step(self, metrics: dict[str, float]) -> None:
        """A finished step's metrics to the step-time histogram, metrics.jsonl, the job's events and the trackers."""
        telemetry.metrics().record_step(metrics["time/step"])
        self.run.log_metrics(self.step, metrics)
        self.events.metrics(self.step, metrics)
        self.trackers.log(self.step, metrics)
