"""Where the time went across the steps of a run: per DAG node and per service.

A node's time is the duration of its `node <id>` span; a service's time in a step is the union
of the intervals of its spans (nested and parallel spans are not counted twice). Printed by
`meshrl trace RUN_DIR --summary` (meshrl.scheduler.traceview.cli), optionally as JSON.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from meshrl.scheduler.traceview.model import Trace
from meshrl.scheduler.traceview.waterfall import format_duration


@dataclass(frozen=True)
class Stat:
    name: str
    count: int  # steps it appears in (nodes: runs)
    total_ns: int
    mean_ns: int
    median_ns: int
    max_ns: int
    share: float  # total / total step time


@dataclass(frozen=True)
class StepRow:
    step: int
    trace_id: str
    duration_ns: int
    spans: int
    errors: int


@dataclass(frozen=True)
class Summary:
    steps: list[StepRow]
    nodes: list[Stat]
    services: list[Stat]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def busy_ns(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals."""
    total, cur_start, cur_end = 0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _stat(name: str, values: list[int], step_total: int) -> Stat:
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) // 2
    total = sum(ordered)
    return Stat(
        name, len(ordered), total, total // len(ordered), median, ordered[-1], total / step_total if step_total else 0.0
    )


def summarize(steps: list[Trace]) -> Summary:
    """Summary over step traces (see model.step_traces)."""
    rows = [StepRow(t.step or 0, t.trace_id, t.duration_ns, len(t.nodes), len(t.errors)) for t in steps]
    step_total = sum(r.duration_ns for r in rows)
    node_times: dict[str, list[int]] = defaultdict(list)
    service_times: dict[str, list[int]] = defaultdict(list)
    for trace in steps:
        per_service: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for node in trace.nodes.values():
            per_service[node.record.service].append((node.start_ns, node.end_ns))
            if node.node_id is not None:
                node_times[node.node_id].append(node.duration_ns)
        for service, intervals in per_service.items():
            service_times[service].append(busy_ns(intervals))
    nodes = sorted((_stat(k, v, step_total) for k, v in node_times.items()), key=lambda s: -s.total_ns)
    services = sorted((_stat(k, v, step_total) for k, v in service_times.items()), key=lambda s: -s.total_ns)
    return Summary(rows, nodes, services)


def _table(title: str, stats: list[Stat], count_label: str) -> list[str]:
    if not stats:
        return [f"{title}: none", ""]
    w = max(len(title), *(len(s.name) for s in stats))
    lines = [f"{title:<{w}} {count_label:>6} {'mean':>10} {'median':>10} {'max':>10} {'total':>10} {'share':>7}"]
    for s in stats:
        lines.append(
            f"{s.name:<{w}} {s.count:>6} {format_duration(s.mean_ns):>10} {format_duration(s.median_ns):>10} "
            f"{format_duration(s.max_ns):>10} {format_duration(s.total_ns):>10} {s.share:>6.1%}"
        )
    return [*lines, ""]


def render_summary(summary: Summary) -> str:
    if not summary.steps:
        return "no step traces found (root spans named 'step N')"
    durations = [r.duration_ns for r in summary.steps]
    errors = sum(r.errors for r in summary.steps)
    lines = [
        f"{len(summary.steps)} steps ({summary.steps[0].step}..{summary.steps[-1].step}), "
        f"mean {format_duration(sum(durations) // len(durations))}, max {format_duration(max(durations))}, "
        f"{errors} error span{'s' if errors != 1 else ''}",
        "",
    ]
    lines += _table("node", summary.nodes, "runs")
    lines += _table("service", summary.services, "steps")
    lines.append("share: fraction of the total step time; a service's time is the union of its spans")
    return "\n".join(lines)
