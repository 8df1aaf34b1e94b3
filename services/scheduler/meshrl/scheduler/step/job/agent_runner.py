"""The job of a multi-agent workflow (design: `step/dag/agents.py`): one trainer and one rollout fleet per agent,
each agent's actor loaded from `model.path`, published to its own replicas under `runs/<job>/weights/<agent>/`
with a weight version of its own, the DAG run once per step (each node on its agent's services), then every
agent's new weights published and verified. Per step: `<agent>/weights/version` and each agent node's metrics
under its agent's name. Sync training only; what it does not support is refused at job creation
(`agents.check_agent_job`). Called by `JobRunner.run_job`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from meshrl.common.errors import Cancelled, InvalidArgument
from meshrl.common.telemetry import attributes as A
from meshrl.scheduler.clients import TrainerClient
from meshrl.scheduler.fleet.rollout_fleet import RolloutFleet
from meshrl.scheduler.fleet.weight_sync import WeightPublisher
from meshrl.scheduler.launch.services import JobServices, rollout_spec, trainer_spec
from meshrl.scheduler.step.dag.agents import AgentHandlers, agents_of
from meshrl.scheduler.step.dag.executor import StepExecutor
from meshrl.scheduler.step.dag.nodes import NodeHandlers
from meshrl.scheduler.step.job.deletions import StepDeletions
from meshrl.scheduler.step.job.job_inputs import prepare_job, read_job_inputs
from meshrl.scheduler.step.job.progress import StepProgress
from meshrl.scheduler.step.pacing.pipeline import StepSpans
from meshrl.scheduler.step.user.user_code import UserCode
from meshrl.scheduler.trackers import open_trackers


@dataclass
class Agent:
    """One agent's services: its trainer (role actor), its replicas and its weight versions."""

    name: str
    trainer: TrainerClient
    fleet: RolloutFleet
    publisher: WeightPublisher


def open_agents(cfg, run, svc: JobServices, names: list[str]) -> list[Agent]:
    """The first agent uses the job's own trainer and replicas; every other agent gets `trainer-<agent>` and
    `rollout-<agent>-<i>`, started by the same launcher and sharing the job's data buffer."""
    weights = run.weights
    agents = [
        Agent(names[0], svc.trainer, svc.fleet, WeightPublisher(svc.trainer, cfg.weights, str(weights / names[0])))
    ]
    buffer_address, channels = svc.addresses["databuffer"], cfg.services.channels
    for name in names[1:]:
        specs = [trainer_spec(cfg, run, f"trainer-{name}", buffer_address, cfg.model.path)]
        specs += [
            rollout_spec(cfg, run, f"rollout-{name}-{i}", buffer_address, cfg.model.path)
            for i in range(cfg.rollout.replicas)
        ]
        started = svc.launcher.start(specs)
        svc.addresses.update(started)
        trainer = TrainerClient(started[f"trainer-{name}"], cfg.trainer.request_timeout_seconds, channels.trainer)
        replicas = [address for n, address in started.items() if n.startswith("rollout-")]
        fleet = RolloutFleet(svc.buffer, replicas, cfg.rollout.request_timeout_seconds, channels.rollout, None)
        agents.append(Agent(name, trainer, fleet, WeightPublisher(trainer, cfg.weights, str(weights / name))))
        trainer.wait_ready(cfg.services.start_timeout_seconds)
    return agents


def publish(agent: Agent, metrics: dict[str, float], events) -> None:
    """Publishes the agent's weights to its replicas and makes them serve exactly that version."""
    result = agent.publisher.publish(agent.fleet.clients())
    agent.fleet.expect_version(result.version)
    agent.fleet.after_publication(result.version, result.stale, events.log, who=f"agent {agent.name}: ")
    metrics.update(
        {
            f"{agent.name}/weights/version": result.version,
            f"{agent.name}/weights/seconds": result.seconds,
            f"{agent.name}/weights/stale_replicas": len(result.stale),
        }
    )


class AgentJob:
    """Runs a multi-agent job for a `JobRunner` (its config, run folder, events, step counter)."""

    def __init__(self, runner) -> None:
        self.r = runner
        self.names = agents_of(runner.workflow.nodes)
        self.spans = StepSpans(runner.job_id)

    def run(self, resume: bool = False) -> dict:
        r, cfg = self.r, self.r.cfg
        if resume:
            raise InvalidArgument("a multi-agent job saves no checkpoints, so it cannot resume; start a new run")
        prepare_job(r.workflow, cfg, r.events.log)
        job = read_job_inputs(cfg)
        svc = JobServices(cfg, r.run, cfg.model.path)
        r.user_code = UserCode(cfg, r.workflow.nodes, r.events.log)
        r.trackers = open_trackers(cfg.logging, r.run.root, r.job_id, cfg.model_dump(mode="json"))
        summary: dict = {"job_id": r.job_id, "run_dir": str(r.run.root), "agents": self.names}
        started, agents = time.monotonic(), []
        try:
            svc.open()
            agents = open_agents(cfg, r.run, svc, self.names)
            r.events.log(f"services up: {svc.addresses}")
            for agent in agents:
                agent.trainer.load_model(
                    "actor",
                    cfg.model.path,
                    cfg.model.dtype,
                    cfg.trainer.optimizer,
                    cfg.job.seed,
                    gradient_checkpointing=cfg.trainer.gradient_checkpointing,
                )
                publish(agent, {}, r.events)
            by_agent = {
                a.name: NodeHandlers(
                    cfg, svc.buffer, a.trainer, a.fleet, job.encoder, job.sampler, job.reward_fn, r.user_code
                )
                for a in agents
            }
            executor = StepExecutor(r.workflow.nodes, AgentHandlers(by_agent).handler_for, r.events)
            try:
                with (
                    StepDeletions(svc.buffer, r.job_id) as deletions,
                    StepProgress(cfg.job.steps, r.step, r.show_progress) as bar,
                ):
                    while r.step < cfg.job.steps:
                        if r.cancelled.is_set():
                            raise Cancelled(f"job {r.job_id} cancelled at step {r.step}")
                        r.step += 1
                        bar.step(r.step, self.step(executor, agents, deletions))
            finally:
                executor.close()
            summary.update(steps=r.step, weight_versions={a.name: a.publisher.version for a in agents})
            return summary
        finally:
            summary["seconds"] = round(time.monotonic() - started, 1)
            for agent in agents[1:]:  # the first agent's clients are the job's, closed with it
                agent.fleet.close()
                agent.trainer.close()
            r.shut_down(svc, summary)  # stops every service its launcher started, every agent's included

    def step(self, executor: StepExecutor, agents: list[Agent], deletions: StepDeletions) -> dict[str, float]:
        r, start = self.r, time.perf_counter()
        with self.spans.use(r.step, end=True) as span:
            span.set_attribute(A.STEP, r.step)
            metrics, _ = executor.run_nodes(r.job_id, r.step)
            for agent in agents:
                publish(agent, metrics, r.events)
            metrics.update(deletions.delete(r.step))
        metrics["time/step"] = time.perf_counter() - start
        r.log_step(metrics)
        return metrics
