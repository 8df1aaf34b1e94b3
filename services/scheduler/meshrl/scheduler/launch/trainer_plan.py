"""Where the plan puts the trainer's ranks and the rollout replicas on the Ray cluster the job runs on: plan node
i is the i-th alive Ray node by address (`placement.cluster_nodes`, the nodes `meshrl plan --nodes` counts),
and rank r's bundle is pinned to the node of its planned worker (`launch_plan.trainer_workers`), replica i's
to the node of its rollout worker (`launch_plan.replica_workers`).

Called by `launch.services.JobServices` before it creates the trainer group (`trainer_group.py`). Ray must be
initialised.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrl.common.errors import FailedPrecondition
from meshrl.scheduler.launch.placement import ClusterNode, cluster_nodes
from meshrl.scheduler.planning.apportion import ClusterSpec, WorkerSlot
from meshrl.scheduler.planning.launch_plan import plan_for_run, replica_workers, trainer_model, trainer_workers
from meshrl.scheduler.planning.plan_types import Plan


@dataclass(frozen=True)
class PlannedRanks:
    """The plan a run launches, the workers of its trainer ranks and the Ray nodes its node indices name."""

    plan: Plan
    workers: tuple[WorkerSlot, ...]
    nodes: tuple[ClusterNode, ...]

    def pins(self) -> list[dict[str, float]]:
        return [self.nodes[w.node].pin() for w in self.workers]

    def replica_pins(self, count: int) -> list[tuple[str, dict[str, float]]]:
        """(plan worker, pin) of each of `count` rollout replicas; empty when the plan has no rollout model."""
        return [(str(w), self.nodes[w.node].pin()) for w in replica_workers(self.plan, count)]

    def labels(self) -> list[str]:
        return [str(w) for w in self.workers]

    def describe(self) -> str:
        """One event line: the cluster as planned, its nodes, and the trainer model whose workers the ranks take."""
        c = self.plan.cluster
        nodes = ", ".join(f"n{i}={n.address}" for i, n in enumerate(self.nodes))
        return (
            f"plan: workflow '{self.plan.dag_id}' on {c.nodes} node(s) x {c.workers_per_node} {c.device} ({nodes}), "
            f"placement {self.plan.options.placement}; trainer ranks on model '{trainer_model(self.plan).key}' "
            f"workers {', '.join(self.labels())}"
        )


def plan_trainer_ranks(workflow, placement: str, world: int, device: str) -> PlannedRanks:
    """Plans `workflow` on the alive Ray nodes that have `device` ("GPU" or "CPU") and returns the workers of
    trainer ranks 0..world-1. Raises FailedPrecondition when no node has the device, PlanError when the plan
    cannot hold the ranks."""
    nodes = cluster_nodes(device)
    if not nodes:
        raise FailedPrecondition(
            f"no alive Ray node has a whole {device}, so the trainer's ranks have nowhere to run. Fix: start Ray "
            f"nodes with {device}s, or give the trainer {'no GPUs (trainer.gpus: 0)' if device == 'GPU' else 'GPUs'}"
        )
    cluster = ClusterSpec(len(nodes), min(n.devices for n in nodes), device)
    plan = plan_for_run(workflow, cluster, placement)
    return PlannedRanks(plan, trainer_workers(plan, world), nodes)
