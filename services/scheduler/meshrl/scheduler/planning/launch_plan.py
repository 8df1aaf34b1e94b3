"""The plan `meshrl run` launches: the planner with `meshrl plan`'s defaults (plan_cli.py) on the cluster Ray
reports, and the workers of the trainer's ranks in it (rank r on the r-th worker of the workflow's actor, or
its first trainer model when it trains no actor).

Called by `launch.services.JobServices` when the trainer's ranks are Ray actors (`trainer.launch: group`).
The trainer service hosts every trainer model of the job (actor, reference, critic) in one world of
data x tensor x pipeline parallel ranks, and the plan gives every trainer model of an agent the same workers;
its ranks take the actor's. Rollout replica i goes to the first worker of the rollout engine's replica
i modulo the plan's count (`replica_workers`).
"""

from __future__ import annotations

from meshrl.scheduler.planning.apportion import ClusterSpec, PlanError, WorkerSlot
from meshrl.scheduler.planning.plan_types import ModelPlan, Placement, Plan, PlanOptions
from meshrl.scheduler.planning.planner import plan_workflow
from meshrl.scheduler.workflow.model import NodeRole


def plan_for_run(workflow, cluster: ClusterSpec, placement: str) -> Plan:
    """The plan `meshrl plan WORKFLOW --nodes N --{gpus,cpus}-per-node W --placement P` prints for the same
    workflow (its trainer layout applied) and cluster."""
    return plan_workflow(workflow, cluster, PlanOptions(placement=Placement(placement)))


def trainer_model(plan: Plan) -> ModelPlan:
    """The model whose workers the trainer's ranks take: the actor, else the first trainer model."""
    trainers = [m for m in plan.models if m.service == "trainer"]
    if not trainers:
        raise PlanError(
            f"workflow '{plan.dag_id}' has no trainer model (actor, reference, critic), so the plan places no "
            "trainer rank. Fix: set trainer.launch: local, or add a model node to the workflow"
        )
    return next((m for m in trainers if m.role == NodeRole.ACTOR), trainers[0])


def trainer_workers(plan: Plan, world: int) -> tuple[WorkerSlot, ...]:
    """The workers of trainer ranks 0..world-1, in rank order. Raises PlanError when the plan gives the
    trainer model fewer workers than the job config's ranks."""
    model = trainer_model(plan)
    if len(model.workers) < world:
        raise PlanError(
            f"the plan gives model '{model.key}' {len(model.workers)} worker(s) on {plan.cluster.nodes} node(s) x "
            f"{plan.cluster.workers_per_node} {plan.cluster.device}, but the trainer is launched with {world} ranks "
            "(trainer.data_parallel x tensor_parallel x pipeline_parallel). Fix: add nodes or devices to the Ray "
            "cluster, or lower the trainer's parallelism"
        )
    return model.workers[:world]


def replica_workers(plan: Plan, count: int) -> tuple[WorkerSlot, ...]:
    """The worker each of `count` launched rollout replicas goes to: the first worker of the plan's rollout
    replica i modulo their number (the job's `rollout.replicas` may differ from the plan's count). Empty when
    the workflow has no rollout model."""
    model = next((m for m in plan.models if m.role == NodeRole.ROLLOUT), None)
    if model is None or not model.workers:
        return ()
    leaders = [model.workers[i * model.unit] for i in range(model.data_parallel)]
    return tuple(leaders[i % len(leaders)] for i in range(count))
