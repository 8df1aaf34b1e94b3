"""Text rendering of a `Plan`: the step DAG as an ASCII diagram, a map of which group uses each device, and
tables of subgraphs, worker groups, models and communication groups. Called by `meshrl plan`.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from meshrl.scheduler.planning.apportion import WorkerSlot
from meshrl.scheduler.planning.planner import Plan


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ") -> list[str]:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, indent + "  ".join("-" * w for w in widths))
    return lines


def format_workers(workers: Sequence[WorkerSlot]) -> str:
    """[n0:0, n0:1, n0:2, n1:0] -> 'n0:0-2 n1:0'."""
    if not workers:
        return "-"
    parts: list[str] = []
    by_node: dict[int, list[int]] = {}
    for w in sorted(workers):
        by_node.setdefault(w.node, []).append(w.device)
    for node, devices in by_node.items():
        start = prev = devices[0]
        for d in devices[1:] + [None]:
            if d is not None and d == prev + 1:
                prev = d
                continue
            parts.append(f"n{node}:{start}" if start == prev else f"n{node}:{start}-{prev}")
            if d is not None:
                start = prev = d
    return " ".join(parts)


def _size(value: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _dag_diagram(plan: Plan) -> list[str]:
    graph, split = plan.graph, plan.split
    lines = ["Step DAG (top to bottom; boxes on one level may run at the same time; '<-' lists inputs)"]
    levels = graph.levels()
    for depth, level in enumerate(levels):
        boxes = []
        for nid in level:
            node = graph.nodes[nid]
            body = [
                f"{nid}  [{split.subgraph_of(nid).subgraph_id}]",
                f"{node.node_type.value}/{node.node_role.value}",
                ("<- " + ", ".join(graph.parents[nid])) if graph.parents[nid] else "(entry)",
            ]
            width = max(len(b) for b in body)
            boxes.append(
                ["+" + "-" * (width + 2) + "+"]
                + [f"| {b.ljust(width)} |" for b in body]
                + ["+" + "-" * (width + 2) + "+"]
            )
        for row in range(len(boxes[0])):
            label = f"L{depth}" if row == 0 else ""
            lines.append(f"  {label:<4}" + "  ".join(box[row] for box in boxes))
        if depth < len(levels) - 1:
            lines.append("        |")
            lines.append("        v")
    return lines


def _device_map(plan: Plan) -> list[str]:
    cluster = plan.cluster
    letters = {g.group_id: string.ascii_uppercase[i % 26] for i, g in enumerate(plan.groups)}
    cell = {w.index: "." for w in cluster.slots()}
    for g in plan.groups:
        for w in g.workers:
            cell[w.index] = letters[g.group_id]
    width = len(str(cluster.workers_per_node - 1))
    lines = [f"Devices ({cluster.device}; letter = worker group, '.' = idle)"]
    lines.append("  device  " + " ".join(str(d).rjust(width) for d in range(cluster.workers_per_node)))
    for node in range(cluster.nodes):
        row = [cell[node * cluster.workers_per_node + d].rjust(width) for d in range(cluster.workers_per_node)]
        lines.append(f"  node {node:<3}" + " ".join(row))
    for g in plan.groups:
        lines.append(f"  {letters[g.group_id]} = {g.group_id}")
    return lines


def render_plan(plan: Plan) -> str:
    """A readable, deterministic text rendering of `plan`."""
    c, o = plan.cluster, plan.options
    out = [
        f"Plan for workflow '{plan.dag_id}': {c.nodes} node(s) x {c.workers_per_node} {c.device} = "
        f"{c.num_workers} workers, placement {o.placement}, strategy {o.strategy}",
        "",
    ]
    out += _dag_diagram(plan)
    out += ["", "Irreducible subgraphs"]
    rows = []
    for sg in plan.split.subgraphs:
        groups = plan.groups_of_subgraph(sg.subgraph_id)
        rows.append(
            (
                sg.subgraph_id,
                " -> ".join(sg.node_ids),
                ", ".join(sg.upstream) or "-",
                ", ".join(groups) if groups else "scheduler (CPU)",
            )
        )
    out += _table(("id", "nodes", "after", "runs on"), rows)
    if plan.split.points:
        out += ["", "Why the graph splits"] + [f"  - {p.describe()}" for p in plan.split.points]
    out += ["", "Worker groups (a group's models time-share its workers)"]
    rows = [
        (g.group_id, len(g.workers), g.unit, _size(g.size), format_workers(g.workers), ", ".join(g.subgraph_ids))
        for g in plan.groups
    ]
    out += _table(("group", "workers", "unit", "size", "ranks 0.. on", "subgraphs"), rows)
    out += ["", "Models"]
    rows = [
        (
            m.key,
            m.service,
            _size(m.param_count) if m.param_count else "?",
            m.param_source,
            f"{m.tensor_parallel}/{m.pipeline_parallel}/{m.data_parallel}",
            m.world_size,
            ", ".join(m.node_ids),
        )
        for m in plan.models
    ]
    out += _table(("model", "service", "params", "source", "tp/pp/dp", "world", "nodes"), rows)
    if plan.comm_groups:
        out += ["", "Communication groups (group rank: model rank @ worker)"]
        rows = [
            (
                cg.name,
                cg.kind,
                cg.backend + (" (shares a device)" if cg.shares_device else ""),
                " ".join(f"{m.rank}:{m.model}@{m.worker}" for m in cg.members),
            )
            for cg in plan.comm_groups
        ]
        out += _table(("name", "kind", "backend", "members"), rows)
    out += [""] + _device_map(plan)
    if plan.notes:
        out += ["", "Notes"] + [f"  - {n}" for n in plan.notes]
    return "\n".join(out) + "\n"
