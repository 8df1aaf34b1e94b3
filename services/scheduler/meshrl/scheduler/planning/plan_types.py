"""What a plan is (the result of `planner.plan_workflow`): the models with their workers and ranks, the
worker groups they share, the communication groups, and the options it was made with. Plain data; the
planner (planner.py) makes it, `meshrl plan` renders it (plan_render.py)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from meshrl.scheduler.planning.apportion import ClusterSpec, WorkerSlot
from meshrl.scheduler.planning.subgraphs import Split
from meshrl.scheduler.workflow.model import NodeRole
from meshrl.scheduler.workflow.taskgraph import TaskGraph

DEFAULT_COSTS: Mapping[str, float] = {"forward": 1.0, "train": 3.0, "rollout": 4.0}


class Placement(str, enum.Enum):
    COLOCATED = "colocated"
    DISAGGREGATED = "disaggregated"

    def __str__(self) -> str:
        return self.value


class Strategy(str, enum.Enum):
    EVEN = "even"
    PARAM_AWARE = "param_aware"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PlanOptions:
    """`param_counts` maps a model key ('actor', 'agent_b.critic') or a role name to its parameter count
    (int or '7B'); `costs` overrides DEFAULT_COSTS ('forward', 'train', 'rollout')."""

    placement: Placement = Placement.COLOCATED
    strategy: Strategy = Strategy.PARAM_AWARE
    param_counts: Mapping[str, int | float | str] = field(default_factory=dict)
    costs: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_COSTS))


@dataclass(frozen=True)
class ModelPlan:
    """One model instance and where it runs. `workers[i]` hosts rank i; for rollout engines each replica is
    `tensor_parallel` consecutive workers (`replicas` lists their worker indices)."""

    key: str
    role: NodeRole
    service: str  # "rollout" or "trainer"
    node_ids: tuple[str, ...]
    param_count: int | None  # None: unknown
    param_source: str  # "given", "node config", "actor" (rollout engines serve the actor's weights), "unknown"
    cost: float
    size: float
    tensor_parallel: int
    pipeline_parallel: int
    group_id: str
    workers: tuple[WorkerSlot, ...]

    @property
    def unit(self) -> int:
        """Devices per model replica."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def world_size(self) -> int:
        return len(self.workers)

    @property
    def data_parallel(self) -> int:
        return self.world_size // self.unit

    @property
    def replicas(self) -> tuple[tuple[int, ...], ...]:
        idx = [w.index for w in self.workers]
        return tuple(tuple(idx[i : i + self.unit]) for i in range(0, len(idx), self.unit))


@dataclass(frozen=True)
class WorkerGroup:
    """Workers shared (time-shared) by `models`; `subgraph_ids` are the subgraphs whose nodes run on them."""

    group_id: str
    models: tuple[str, ...]
    subgraph_ids: tuple[str, ...]
    size: float
    unit: int
    workers: tuple[WorkerSlot, ...]


@dataclass(frozen=True)
class CommMember:
    model: str
    rank: int  # rank inside the communication group
    worker: WorkerSlot


@dataclass(frozen=True)
class CommGroup:
    """A set of ranks that must share a collective communicator. `shares_device` is True when two members
    sit on one device (NCCL cannot hold both: use the disk weight transport, or CUDA IPC)."""

    name: str
    kind: str  # "model" | "tensor_parallel" | "weight_sync"
    backend: str  # "nccl" on GPUs, "gloo" on CPUs
    members: tuple[CommMember, ...]
    shares_device: bool = False


@dataclass(frozen=True)
class Plan:
    dag_id: str
    cluster: ClusterSpec
    options: PlanOptions
    graph: TaskGraph
    split: Split
    models: tuple[ModelPlan, ...]
    groups: tuple[WorkerGroup, ...]
    comm_groups: tuple[CommGroup, ...]
    idle: tuple[WorkerSlot, ...]
    notes: tuple[str, ...]

    def model(self, key: str) -> ModelPlan:
        for m in self.models:
            if m.key == key:
                return m
        raise KeyError(f"plan has no model '{key}' (models: {', '.join(m.key for m in self.models)})")

    def group(self, group_id: str) -> WorkerGroup:
        for g in self.groups:
            if g.group_id == group_id:
                return g
        raise KeyError(f"plan has no worker group '{group_id}'")

    def groups_of_subgraph(self, subgraph_id: str) -> tuple[str, ...]:
        """Worker groups a subgraph's model nodes run on; () for subgraphs the scheduler runs itself."""
        return tuple(g.group_id for g in self.groups if subgraph_id in g.subgraph_ids)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (for `meshrl plan --json` and job events)."""
        return {
            "dag_id": self.dag_id,
            "cluster": asdict(self.cluster),
            "placement": str(self.options.placement),
            "strategy": str(self.options.strategy),
            "subgraphs": [
                {**asdict(sg), "groups": list(self.groups_of_subgraph(sg.subgraph_id))} for sg in self.split.subgraphs
            ],
            "split_points": [p.describe() for p in self.split.points],
            "models": [
                {
                    **{k: v for k, v in asdict(m).items() if k not in ("workers", "role")},
                    "role": str(m.role),
                    "workers": [w.index for w in m.workers],
                    "replicas": [list(r) for r in m.replicas],
                }
                for m in self.models
            ],
            "groups": [{**asdict(g), "workers": [w.index for w in g.workers]} for g in self.groups],
            "comm_groups": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    "backend": c.backend,
                    "shares_device": c.shares_device,
                    "members": [{"model": m.model, "rank": m.rank, "worker": m.worker.index} for m in c.members],
                }
                for c in self.comm_groups
            ],
            "idle": [w.index for w in self.idle],
            "notes": list(self.notes),
        }
