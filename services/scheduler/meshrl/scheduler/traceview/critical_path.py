"""The critical path of a trace: the chain of spans that set the step's wall time.

Walking back from the end of a span, the child that finished last is what the span waited for;
that child's own critical path is taken, then the walk continues from the child's start among
the children that finished before it. Gaps with no child are the span's own time. Used by the
waterfall and timeline renderers of this package.
"""

from __future__ import annotations

from meshrl.scheduler.traceview.model import SpanNode, Trace


def _walk(node: SpanNode, until_ns: int, out: set[str]) -> None:
    out.add(node.span_id)
    cursor = min(node.end_ns, until_ns)
    remaining = list(node.children)
    while remaining:
        # Children still running at the cursor ran in parallel with the one already taken.
        candidates = [c for c in remaining if c.start_ns < cursor and min(c.end_ns, node.end_ns) <= cursor]
        if not candidates:
            break
        last = max(candidates, key=lambda c: (min(c.end_ns, cursor), c.duration_ns))
        _walk(last, cursor, out)
        cursor = last.start_ns
        remaining = [c for c in remaining if c is not last and c.start_ns < cursor]


def critical_path(trace: Trace, root: SpanNode | None = None) -> set[str]:
    """Span ids on the critical path from `root` (default: the step span or the longest root)."""
    out: set[str] = set()
    start = root or trace.main_root
    _walk(start, start.end_ns, out)
    return out
