"""Task planning (siiRL's TaskScheduler, improved): which workers each model of a workflow runs on, with
which ranks, and which ranks need a communication group.

Called by `meshrl plan` (plan_cli.py) and by whoever launches a job's services. Nothing here starts anything.

1. The task graph is split into irreducible subgraphs (`subgraphs.split_irreducible`).
2. Each model the workflow uses (rollout engines, actor, reference, critic, reward model; per agent) is
   sized by its parameter count times the cost of its nodes (a forward pass 1, a training pass 3, a rollout
   4 by default: decoding is memory-bound and usually dominates a step).
3. Worker groups: the models that share workers.
   - colocated: one group, every model on every worker; roles time-share the devices.
   - disaggregated: the rollout engines never share workers with trainer roles; rollout engines used in
     one subgraph share workers. Every trainer model of one agent (actor, reference, critic, reward model)
     shares that agent's workers, because that is what `meshrl run` launches: one trainer service (one
     world of data x tensor x pipeline parallel ranks) holds all of them, and its roles take turns. siiRL
     gives trainer models on parallel branches (GRPO's actor and reference forward passes) workers of their
     own; a plan that did so here would describe workers no run starts.
4. Workers are apportioned to groups (even or parameter-aware, in whole replicas) and picked with node
   cohesion (`apportion.py`); a group's models all use its workers, rank i on its i-th worker.
5. Communication groups: each trainer model's world (data x tensor x pipeline parallel), each multi-device
   rollout replica, and the weight-sync group of actor rank 0 plus every rollout replica's first worker.
   Data between subgraphs flows through the data buffer, so no group is needed for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from meshrl.scheduler.planning.apportion import ClusterSpec, PlanError, WorkerSlot, apportion, assign_workers
from meshrl.scheduler.planning.plan_types import (
    DEFAULT_COSTS,
    CommGroup,
    CommMember,
    ModelPlan,
    Placement,
    Plan,
    PlanOptions,
    Strategy,
    WorkerGroup,
)
from meshrl.scheduler.planning.subgraphs import Split, split_irreducible
from meshrl.scheduler.workflow import compute_catalog as cat
from meshrl.scheduler.workflow.model import Node, NodeRole, NodeType, Workflow
from meshrl.scheduler.workflow.taskgraph import TaskGraph

__all__ = [
    "DEFAULT_COSTS",
    "ClusterSpec",
    "CommGroup",
    "CommMember",
    "ModelPlan",
    "Placement",
    "Plan",
    "PlanError",
    "PlanOptions",
    "Strategy",
    "WorkerGroup",
    "WorkerSlot",
    "plan_workflow",
]


def _node_cost(node: Node, costs: Mapping[str, float]) -> float:
    if node.node_type == NodeType.ROLLOUT:
        return costs["rollout"]
    return costs["forward"] if node.is_forward_only else costs["train"]


def _agreed_int(nodes: list[Node], key: str, model: str) -> int:
    values = {n.node_id: n.config[key] for n in nodes if key in n.config}
    if len(set(values.values())) > 1:
        shown = ", ".join(f"{nid}={v}" for nid, v in values.items())
        raise PlanError(f"model '{model}': nodes disagree on config.{key} ({shown}). Fix: give them one value")
    return int(next(iter(values.values()), 1))


def _param_count(key: str, role: NodeRole, nodes: list[Node], given: Mapping[str, Any]) -> tuple[int | None, str]:
    for name in (key, role.value.lower()):
        if name in given:
            try:
                return cat.parse_param_count(given[name]), "given"
            except ValueError as exc:
                raise PlanError(f"param count for '{name}': {exc}. Fix: write e.g. {name}=7B") from None
    values = {
        cat.parse_param_count(n.config[cat.CONFIG_PARAM_COUNT]) for n in nodes if cat.CONFIG_PARAM_COUNT in n.config
    }
    if len(values) > 1:
        raise PlanError(f"model '{key}': nodes disagree on config.param_count ({sorted(values)}). Fix: give one value")
    if values:
        return values.pop(), "node config"
    return None, "unknown"


def _models(wf: Workflow, options: PlanOptions) -> dict[str, dict[str, Any]]:
    costs = {**DEFAULT_COSTS, **options.costs}
    by_key: dict[str, list[Node]] = {}
    for n in wf.nodes:
        if n.model_key is not None:
            by_key.setdefault(n.model_key, []).append(n)
    known = set(by_key) | {r.value.lower() for r in NodeRole}
    unknown = [k for k in options.param_counts if k not in known]
    if unknown:
        raise PlanError(
            f"param counts given for {', '.join(unknown)}, which workflow '{wf.dag_id}' does not use. "
            f"Fix: name one of its models: {', '.join(by_key)}"
        )
    models: dict[str, dict[str, Any]] = {}
    for key, nodes in by_key.items():
        role = nodes[0].node_role
        count, source = _param_count(key, role, nodes, options.param_counts)
        models[key] = {
            "key": key,
            "role": role,
            "service": "rollout" if role == NodeRole.ROLLOUT else "trainer",
            "node_ids": tuple(n.node_id for n in nodes),
            "param_count": count,
            "param_source": source,
            "cost": sum(_node_cost(n, costs) for n in nodes),
            "tensor_parallel": _agreed_int(nodes, cat.CONFIG_TP, key),
            "pipeline_parallel": _agreed_int(nodes, cat.CONFIG_PP, key),
        }
    for key, m in models.items():  # rollout engines serve the actor's weights
        if m["param_count"] is None and m["role"] == NodeRole.ROLLOUT:
            actor = key[: -len("rollout")] + "actor"
            if actor in models and models[actor]["param_count"] is not None:
                m["param_count"], m["param_source"] = models[actor]["param_count"], "actor"
    for m in models.values():
        m["size"] = m["cost"] * (m["param_count"] or 1)
    return models


def _groups(split: Split, graph: TaskGraph, models: Mapping[str, dict], placement: Placement) -> list[list[str]]:
    """Model keys that share workers, each group in file order of its models."""
    keys = list(models)
    if placement == Placement.COLOCATED:
        return [keys] if keys else []
    parent = {k: k for k in keys}

    def find(k: str) -> str:
        while parent[k] != k:
            k = parent[k]
        return k

    for sg in split.subgraphs:
        used = dict.fromkeys(graph.nodes[n].model_key for n in sg.node_ids if graph.nodes[n].model_key)
        side = [k for k in used if models[k]["service"] == "rollout"]
        for k in side[1:]:
            parent[find(k)] = find(side[0])
    trainers: dict[str, str] = {}  # agent -> its first trainer model: the agent's one trainer service
    for k in keys:
        if models[k]["service"] == "trainer":
            first = trainers.setdefault(k.rpartition(".")[0], k)
            parent[find(k)] = find(first)
    out: dict[str, list[str]] = {}
    for k in keys:
        out.setdefault(find(k), []).append(k)
    return list(out.values())


def plan_workflow(workflow: Workflow, cluster: ClusterSpec, options: PlanOptions | None = None) -> Plan:
    """Plans `workflow` on `cluster`. Raises PlanError when it cannot be placed there.

    Kept whole: it reads as the planning pipeline, split -> models -> apportion -> ranks -> groups, each a call.
    """
    options = options or PlanOptions()
    graph = TaskGraph.from_workflow(workflow)
    split = split_irreducible(graph)
    models = _models(workflow, options)
    notes: list[str] = []
    missing = [k for k, m in models.items() if m["param_count"] is None]
    if options.strategy == Strategy.PARAM_AWARE and missing and len(missing) < len(models):
        raise PlanError(
            f"param_aware needs every model's parameter count; unknown: {', '.join(missing)}. "
            f"Fix: add --param-counts {missing[0]}=N (or config.param_count on its nodes), or use --strategy even"
        )
    if missing and len(missing) == len(models):
        notes.append("no parameter counts given: models are sized by the cost of their nodes only")
    group_keys = _groups(split, graph, models, Placement(options.placement))
    gid = ["+".join(keys) for keys in group_keys]
    units = {
        g: math.lcm(*(models[k]["tensor_parallel"] * models[k]["pipeline_parallel"] for k in keys))
        for g, keys in zip(gid, group_keys, strict=True)
    }
    sizes = {g: sum(models[k]["size"] for k in keys) for g, keys in zip(gid, group_keys, strict=True)}
    total = cluster.num_workers
    if options.placement == Placement.COLOCATED:
        for g in gid:
            if total % units[g]:
                raise PlanError(
                    f"models {g} need a multiple of {units[g]} workers (tensor x pipeline parallel) but the cluster "
                    f"has {total}. Fix: change the node count or tensor_parallel_size / pipeline_parallel_size"
                )
        workers = {g: cluster.slots() for g in gid}
    else:
        weights = sizes if options.strategy == Strategy.PARAM_AWARE else dict.fromkeys(gid, 1.0)
        counts = apportion(weights, units, total, sizes)
        position = {g: i for i, g in enumerate(gid)}
        order = sorted(gid, key=lambda g: (-counts[g], -sizes[g], position[g]))
        workers = assign_workers(counts, units, cluster, order)
    used = {w for ws in workers.values() for w in ws}
    idle = tuple(w for w in cluster.slots() if w not in used)
    if idle and not gid:
        notes.append("the workflow uses no model: every worker is idle")
    elif idle:
        notes.append(f"{len(idle)} worker(s) idle: no group's replica size fits them ({', '.join(map(str, idle))})")
    model_plans = []
    group_of = {k: g for g, keys in zip(gid, group_keys, strict=True) for k in keys}
    for key, m in models.items():
        model_plans.append(ModelPlan(**m, group_id=group_of[key], workers=workers[group_of[key]]))
    groups = []
    for g, keys in zip(gid, group_keys, strict=True):
        sgs = tuple(
            sg.subgraph_id for sg in split.subgraphs if any(graph.nodes[n].model_key in keys for n in sg.node_ids)
        )
        groups.append(WorkerGroup(g, tuple(keys), sgs, sizes[g], units[g], workers[g]))
    comm = _comm_groups(model_plans, cluster)
    if any(c.shares_device for c in comm):
        notes.append(
            "weight sync: actor rank 0 shares a device with a rollout replica; use the disk weight transport "
            "(or CUDA IPC) there, since NCCL cannot hold two ranks on one device"
        )
    driver = [sg.subgraph_id for sg in split.subgraphs if not any(graph.nodes[n].is_model_node for n in sg.node_ids)]
    if driver:
        notes.append(f"subgraphs {', '.join(driver)} hold no model: the scheduler runs them itself (CPU)")
    return Plan(
        workflow.dag_id, cluster, options, graph, split, tuple(model_plans), tuple(groups), comm, idle, tuple(notes)
    )


def _comm_groups(models: list[ModelPlan], cluster: ClusterSpec) -> tuple[CommGroup, ...]:
    backend = "nccl" if cluster.device == "GPU" else "gloo"
    out: list[CommGroup] = []
    by_key = {m.key: m for m in models}
    for m in models:
        if m.service == "trainer":
            members = tuple(CommMember(m.key, r, w) for r, w in enumerate(m.workers))
            out.append(CommGroup(m.key, "model", backend, members))
        elif m.unit > 1:
            for i in range(m.data_parallel):
                ws = m.workers[i * m.unit : (i + 1) * m.unit]
                members = tuple(CommMember(m.key, r, w) for r, w in enumerate(ws))
                out.append(CommGroup(f"{m.key}.replica{i}", "tensor_parallel", backend, members))
    for m in models:
        if m.role != NodeRole.ROLLOUT:
            continue
        actor = by_key.get(m.key[: -len("rollout")] + "actor")
        if actor is None:
            continue
        leaders = [m.workers[i * m.unit] for i in range(m.data_parallel)]
        members = (CommMember(actor.key, 0, actor.workers[0]),) + tuple(
            CommMember(m.key, i + 1, w) for i, w in enumerate(leaders)
        )
        out.append(CommGroup(f"{actor.key}->{m.key}", "weight_sync", backend, members, actor.workers[0] in leaders))
    return tuple(out)
