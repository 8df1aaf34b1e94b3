"""Traces rebuilt from a run's span files: span trees grouped by trace, found by training step.

`load_run` reads RUN_DIR/traces/*.jsonl (written by meshrl.common.telemetry's file exporter);
the waterfall, timeline and summary modules of this package and `meshrl trace` work on the
`Trace` objects it returns.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshrl.common.errors import NotFound
from meshrl.common.telemetry import SpanRecord, read_span_files
from meshrl.common.telemetry.attributes import NODE_ID, NODE_SPAN_PREFIX, STEP, STEP_SPAN_PREFIX


@dataclass(eq=False)
class SpanNode:
    """One span in its trace tree; children are sorted by start time."""

    record: SpanRecord
    parent: SpanNode | None = None
    children: list[SpanNode] = field(default_factory=list)
    depth: int = 0

    @property
    def span_id(self) -> str:
        return self.record.span_id

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def start_ns(self) -> int:
        return self.record.start_ns

    @property
    def end_ns(self) -> int:
        return self.record.end_ns

    @property
    def duration_ns(self) -> int:
        return self.record.duration_ns

    @property
    def lane(self) -> str:
        return self.record.lane

    @property
    def attributes(self) -> dict[str, Any]:
        return dict(self.record.attributes)

    @property
    def node_id(self) -> str | None:
        """The DAG node this span runs (`node <id>` spans), else None."""
        value = self.record.attributes.get(NODE_ID)
        if value is not None and self.name.startswith(NODE_SPAN_PREFIX):
            return str(value)
        if self.name.startswith(NODE_SPAN_PREFIX):
            return self.name[len(NODE_SPAN_PREFIX) :]
        return None


@dataclass(eq=False)
class Trace:
    """All spans of one trace id: the tree(s), the step it belongs to and its extent."""

    trace_id: str
    roots: list[SpanNode]
    nodes: dict[str, SpanNode]

    @property
    def start_ns(self) -> int:
        return min(n.start_ns for n in self.nodes.values())

    @property
    def end_ns(self) -> int:
        return max(n.end_ns for n in self.nodes.values())

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def main_root(self) -> SpanNode:
        """The step span when there is one, else the longest root."""
        steps = [r for r in self.roots if _step_of(r.record) is not None]
        return (steps or sorted(self.roots, key=lambda r: -r.duration_ns))[0]

    @property
    def step(self) -> int | None:
        for root in self.roots:
            step = _step_of(root.record)
            if step is not None:
                return step
        return None

    @property
    def errors(self) -> list[SpanNode]:
        return [n for n in self.walk() if n.record.is_error]

    @property
    def lanes(self) -> list[str]:
        """Lanes (service or service/instance) in order of their first span."""
        seen: dict[str, int] = {}
        for node in sorted(self.nodes.values(), key=lambda n: n.start_ns):
            seen.setdefault(node.lane, node.start_ns)
        return list(seen)

    def walk(self) -> Iterator[SpanNode]:
        """Depth-first, children in start order (the waterfall's order)."""
        stack = list(reversed(self.roots))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


def _step_of(record: SpanRecord) -> int | None:
    """The step of a root span: `step N` (attribute meshrl.step wins over the name)."""
    if record.name.startswith(STEP_SPAN_PREFIX):
        raw = record.attributes.get(STEP, record.name[len(STEP_SPAN_PREFIX) :])
    elif record.parent_span_id is None and STEP in record.attributes:
        raw = record.attributes[STEP]
    else:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def build_traces(records: Iterable[SpanRecord]) -> list[Trace]:
    """Groups records by trace id and links parents; a span whose parent is missing (not
    exported, or from a process whose file is absent) becomes a root. Sorted by start time."""
    by_trace: dict[str, dict[str, SpanNode]] = {}
    for record in records:
        nodes = by_trace.setdefault(record.trace_id, {})
        nodes.setdefault(record.span_id, SpanNode(record))
    traces = []
    for trace_id, nodes in by_trace.items():
        roots = []
        for node in nodes.values():
            parent = nodes.get(node.record.parent_span_id) if node.record.parent_span_id else None
            if parent is None or parent is node:
                roots.append(node)
            else:
                node.parent = parent
                parent.children.append(node)
        for node in nodes.values():
            node.children.sort(key=lambda n: (n.start_ns, n.span_id))
        roots.sort(key=lambda n: (n.start_ns, n.span_id))
        trace = Trace(trace_id, roots, nodes)
        for node in trace.walk():
            node.depth = node.parent.depth + 1 if node.parent is not None else 0
        traces.append(trace)
    traces.sort(key=lambda t: t.start_ns)
    return traces


def span_files(location: str | os.PathLike[str]) -> list[Path]:
    """The JSONL span files of a run folder (RUN_DIR/traces/*.jsonl), a traces folder or one file."""
    path = Path(location)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise NotFound(f"{path} does not exist: pass a run folder (with traces/*.jsonl) or a .jsonl span file")
    folder = path / "traces" if (path / "traces").is_dir() else path
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise NotFound(
            f"no span files (*.jsonl) in {folder}: run the job with telemetry.exporter=file "
            "(the file exporter writes RUN_DIR/traces/<service>.jsonl)"
        )
    return files


def output_folder(location: str | os.PathLike[str]) -> Path:
    """Where rendered timelines go: the folder holding the span files."""
    return span_files(location)[0].parent


def load_run(location: str | os.PathLike[str]) -> list[Trace]:
    """Every trace in a run's span files, oldest first."""
    return build_traces(read_span_files(span_files(location)))


def find_step(traces: list[Trace], step: int) -> Trace:
    """The trace of training step `step` (the latest one if the step ran more than once)."""
    matches = [t for t in traces if t.step == step]
    if not matches:
        steps = sorted({t.step for t in traces if t.step is not None})
        shown = ", ".join(map(str, steps[:20])) + (" ..." if len(steps) > 20 else "")
        raise NotFound(f"no trace for step {step}; steps with a trace: {shown or 'none'}")
    return matches[-1]


def step_traces(traces: list[Trace]) -> list[Trace]:
    """The traces rooted in a `step N` span, by step (latest run of a repeated step wins)."""
    by_step: dict[int, Trace] = {}
    for trace in traces:
        if trace.step is not None:
            by_step[trace.step] = trace
    return [by_step[k] for k in sorted(by_step)]
