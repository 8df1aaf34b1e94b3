"""The terminal waterfall of one trace: the span tree indented, with lane, start offset, duration
and a bar on a shared time axis; `*` marks the critical path, `!` an error (its message below).

`meshrl trace RUN_DIR --step N` prints it (meshrl.scheduler.traceview.cli).
"""

from __future__ import annotations

from meshrl.scheduler.traceview.model import Trace


def format_duration(ns: int) -> str:
    """1234 -> '1 µs', 1_500_000 -> '1.5 ms', 2_340_000_000 -> '2.34 s'."""
    if ns < 1_000_000:
        return f"{ns / 1_000:.0f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1_000_000:.1f} ms"
    if ns < 600_000_000_000:
        return f"{ns / 1_000_000_000:.2f} s"
    return f"{ns / 60_000_000_000:.1f} min"


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _bar(start: int, end: int, t0: int, total: int, width: int) -> str:
    if total <= 0:
        return "█" * width
    first = min(width - 1, int((start - t0) * width / total))
    last = max(first + 1, min(width, -(-(end - t0) * width // total)))
    return " " * first + "█" * (last - first) + " " * (width - last)


def render_waterfall(trace: Trace, critical: set[str] | None = None, width: int = 120) -> str:
    """The waterfall as text, `width` columns wide (at least 80)."""
    critical = critical or set()
    width = max(80, width)
    nodes = list(trace.walk())
    t0, total = trace.start_ns, trace.duration_ns
    name_w = min(56, max(len("span"), *(2 * n.depth + len(n.name) for n in nodes)))
    lane_w = min(28, max(len("service"), *(len(n.lane) for n in nodes)))
    fixed = 2 + name_w + 2 + lane_w + 1 + 10 + 1 + 10 + 2 + 2
    bar_w = max(10, width - fixed)

    services = sorted({n.record.service for n in nodes})
    title = trace.main_root.name
    header = (
        f"{title}  trace {trace.trace_id}  {format_duration(total)}  "
        f"{len(nodes)} spans  {len(services)} services ({', '.join(services)})"
    )
    errors = trace.errors
    if errors:
        header += f"  {len(errors)} error{'s' if len(errors) > 1 else ''}"
    lines = [header, ""]
    lines.append(f"  {'span':<{name_w}}  {'service':<{lane_w}} {'start':>10} {'duration':>10}  |{'':<{bar_w}}|")
    for node in nodes:
        mark = "!" if node.record.is_error else " "
        crit = "*" if node.span_id in critical else " "
        label = _truncate("  " * node.depth + node.name, name_w)
        lines.append(
            f"{mark}{crit}{label:<{name_w}}  {_truncate(node.lane, lane_w):<{lane_w}} "
            f"{format_duration(node.start_ns - t0):>10} {format_duration(node.duration_ns):>10}  "
            f"|{_bar(node.start_ns, node.end_ns, t0, total, bar_w)}|"
        )
        if node.record.is_error:
            message = node.record.status_message or "error"
            lines.append(f"{'':4}{'  ' * node.depth}└ error: {_truncate(message, width - 14 - 2 * node.depth)}")
    lines.append("")
    lines.append("* critical path   ! error   bars share one time axis from the first span's start")
    return "\n".join(lines)
