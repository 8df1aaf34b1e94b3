"""The timeline of one trace as a picture: one lane per service (or replica), spans as bars on a
shared time axis, overlapping spans of a lane on separate rows, the critical path outlined and
errors in red. Written as a self-contained HTML page (SVG, tooltips, the waterfall below it) and
as a PNG (matplotlib) by `meshrl trace RUN_DIR --step N` (meshrl.scheduler.traceview.cli).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from meshrl.scheduler.traceview.model import SpanNode, Trace
from meshrl.scheduler.traceview.waterfall import format_duration, render_waterfall

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac", "#ff9da7")
ERROR_COLOR = "#d62728"
CRITICAL_COLOR = "#111111"


@dataclass(frozen=True)
class Bar:
    node: SpanNode
    lane: int
    row: int  # row within the lane


@dataclass(frozen=True)
class Layout:
    lanes: list[str]
    rows: list[int]  # rows per lane
    bars: list[Bar]
    t0_ns: int
    total_ns: int

    def y_of(self, bar: Bar) -> int:
        """Global row index of a bar (lanes stacked top to bottom)."""
        return sum(self.rows[: bar.lane]) + bar.row


def layout(trace: Trace) -> Layout:
    """Assigns every span a lane and the first free row of it (first fit in start order)."""
    lanes = trace.lanes
    index = {lane: i for i, lane in enumerate(lanes)}
    row_ends: list[list[int]] = [[] for _ in lanes]
    bars = []
    for node in sorted(trace.nodes.values(), key=lambda n: (n.start_ns, -n.duration_ns, n.depth)):
        ends = row_ends[index[node.lane]]
        row = next((i for i, end in enumerate(ends) if end <= node.start_ns), len(ends))
        if row == len(ends):
            ends.append(node.end_ns)
        else:
            ends[row] = node.end_ns
        bars.append(Bar(node, index[node.lane], row))
    return Layout(lanes, [max(1, len(e)) for e in row_ends], bars, trace.start_ns, max(1, trace.duration_ns))


def lane_colors(lanes: list[str]) -> dict[str, str]:
    services = sorted({lane.split("/", 1)[0] for lane in lanes})
    by_service = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(services)}
    return {lane: by_service[lane.split("/", 1)[0]] for lane in lanes}


def _tooltip(node: SpanNode, t0: int, critical: set[str]) -> str:
    lines = [
        node.name,
        f"{node.lane} · {node.record.kind.lower()}",
        f"start +{format_duration(node.start_ns - t0)} · {format_duration(node.duration_ns)}",
    ]
    if node.span_id in critical:
        lines.append("on the critical path")
    if node.record.is_error:
        lines.append(f"ERROR: {node.record.status_message or ''}")
    lines.extend(f"{k} = {v}" for k, v in sorted(node.record.attributes.items()))
    return "\n".join(lines)


def _tick_step(total_s: float) -> float:
    for step in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600):
        if total_s / step <= 10:
            return step
    return 1200.0


_LABEL_W, _CHART_W, _ROW_H, _TOP, _PAD = 210, 1100, 22, 40, 6


def _svg_grid(total_ns: int, height: int) -> list[str]:
    """Vertical second ticks over the chart."""
    scale = _CHART_W / total_ns
    parts, total_s = [], total_ns / 1e9
    step, tick = _tick_step(total_s), 0.0
    while tick <= total_s + 1e-12:
        x = _LABEL_W + tick * 1e9 * scale
        parts.append(f'<line x1="{x:.1f}" y1="{_TOP - 6}" x2="{x:.1f}" y2="{height - 30}" stroke="#ddd"/>')
        parts.append(f'<text x="{x:.1f}" y="{_TOP - 10}" text-anchor="middle" fill="#555">{tick:g} s</text>')
        tick += step
    return parts


def _svg_lanes(lay) -> tuple[list[str], list[int]]:
    """One shaded band per service lane, with its name; returns the parts and each lane's top."""
    parts, lane_top, y = [], [], _TOP
    for i, lane in enumerate(lay.lanes):
        lane_top.append(y)
        h = lay.rows[i] * _ROW_H
        fill = "#f7f7f7" if i % 2 else "#fff"
        parts.append(f'<rect x="0" y="{y}" width="{_LABEL_W + _CHART_W + 20}" height="{h}" fill="{fill}"/>')
        parts.append(f'<text x="8" y="{y + 15}" font-weight="bold">{html.escape(lane)}</text>')
        y += h + _PAD
    return parts, lane_top


def _svg_bar(bar, lay, lane_top: list[int], colors: dict, critical: set[str]) -> str:
    """One span as a bar with its tooltip, outlined when it is on the critical path."""
    node, scale = bar.node, _CHART_W / lay.total_ns
    x = _LABEL_W + (node.start_ns - lay.t0_ns) * scale
    w = max(1.5, node.duration_ns * scale)
    by = lane_top[bar.lane] + bar.row * _ROW_H + 2
    fill = ERROR_COLOR if node.record.is_error else colors[node.lane]
    crit = node.span_id in critical
    stroke = f'stroke="{CRITICAL_COLOR}" stroke-width="2.5"' if crit else 'stroke="#fff" stroke-width="0.5"'
    tip = html.escape(_tooltip(node, lay.t0_ns, critical))
    out = (
        f'<g class="span{" critical" if crit else ""}{" error" if node.record.is_error else ""}">'
        f'<title>{tip}</title><rect x="{x:.1f}" y="{by}" width="{w:.1f}" height="{_ROW_H - 4}" rx="2" '
        f'fill="{fill}" {stroke}/>'
    )
    label = node.name
    if w > 7 * min(len(label), 6):
        shown = label if 7 * len(label) < w else label[: max(1, int(w / 7) - 1)] + "…"
        out += f'<text x="{x + 3:.1f}" y="{by + 13}" fill="#fff">{html.escape(shown)}</text>'
    return out + "</g>"


def _svg_legend(height: int) -> str:
    y = height - 12
    return (
        f'<rect x="{_LABEL_W}" y="{y - 10}" width="14" height="12" fill="#ccc" stroke="{CRITICAL_COLOR}" '
        f'stroke-width="2.5"/><text x="{_LABEL_W + 20}" y="{y}">critical path</text>'
        f'<rect x="{_LABEL_W + 120}" y="{y - 10}" width="14" height="12" fill="{ERROR_COLOR}"/>'
        f'<text x="{_LABEL_W + 140}" y="{y}">error</text>'
    )


def render_html(trace: Trace, critical: set[str]) -> str:
    """A self-contained HTML page with the SVG timeline and the text waterfall."""
    lay = layout(trace)
    colors = lane_colors(lay.lanes)
    height = _TOP + sum(lay.rows) * _ROW_H + len(lay.lanes) * _PAD + 30
    lanes, lane_top = _svg_lanes(lay)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LABEL_W + _CHART_W + 20}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        *_svg_grid(lay.total_ns, height),
        *lanes,
        *(_svg_bar(bar, lay, lane_top, colors, critical) for bar in lay.bars),
        _svg_legend(height),
        "</svg>",
    ]
    title = f"{trace.main_root.name} — trace {trace.trace_id}"
    waterfall = html.escape(render_waterfall(trace, critical, width=160))
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:16px} g.span:hover rect{opacity:.8} "
        "pre{font-size:12px;background:#fafafa;padding:8px;overflow-x:auto}</style></head><body>"
        f"<h2>{html.escape(title)}</h2><p>{format_duration(trace.duration_ns)}, {len(trace.nodes)} spans, "
        f"lanes: {html.escape(', '.join(lay.lanes))}. Hover a bar for its attributes.</p>"
        + "".join(parts)
        + f"<h3>Waterfall</h3><pre>{waterfall}</pre></body></html>\n"
    )


def write_html(trace: Trace, path: str | Path, critical: set[str]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(trace, critical), encoding="utf-8")
    return out


def _png_bars(ax, lay, colors: dict, critical: set[str]) -> None:
    """Every span as a horizontal bar, named where the name fits."""
    total_s = lay.total_ns / 1e9
    char_s = total_s * 0.0065  # one 7-pt character on the 14-inch axis, in seconds
    for bar in lay.bars:
        node, y = bar.node, lay.y_of(bar)
        left = (node.start_ns - lay.t0_ns) / 1e9
        width = max(node.duration_ns / 1e9, total_s / 1500)
        crit = node.span_id in critical
        color = ERROR_COLOR if node.record.is_error else colors[node.lane]
        ax.barh(
            y,
            width,
            left=left,
            height=0.8,
            color=color,
            edgecolor=CRITICAL_COLOR if crit else "white",
            linewidth=2.0 if crit else 0.4,
        )
        if width > char_s * min(len(node.name), 8):
            chars = int(width / char_s)
            text = node.name if len(node.name) <= chars else node.name[: max(1, chars - 1)] + "…"
            ax.text(left + total_s * 0.003, y, text, va="center", ha="left", fontsize=7, color="white", clip_on=True)


def _png_axes(ax, lay, trace: Trace) -> None:
    """Lane names and separators, limits, title and the legend."""
    from matplotlib.patches import Patch

    ticks, labels, row = [], [], 0
    for lane, rows in zip(lay.lanes, lay.rows, strict=True):
        ticks.append(row + (rows - 1) / 2)
        labels.append(lane)
        row += rows
        ax.axhline(row - 0.5, color="#cccccc", linewidth=0.6)
    ax.set_yticks(ticks, labels)
    ax.set_ylim(sum(lay.rows) - 0.5, -0.5)
    ax.set_xlim(0, lay.total_ns / 1e9 * 1.01)
    ax.set_xlabel("seconds from the first span")
    ax.set_title(f"{trace.main_root.name} — {format_duration(trace.duration_ns)} — trace {trace.trace_id}", loc="left")
    legend = [
        Patch(facecolor="#cccccc", edgecolor=CRITICAL_COLOR, linewidth=2.0, label="critical path"),
        Patch(facecolor=ERROR_COLOR, label="error"),
    ]
    ax.legend(handles=legend, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False)


def write_png(trace: Trace, path: str | Path, critical: set[str]) -> Path:
    """The same timeline as a PNG image (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lay = layout(trace)
    fig, ax = plt.subplots(figsize=(14, 1.2 + 0.32 * sum(lay.rows) + 0.2 * len(lay.lanes)))
    try:
        _png_bars(ax, lay, lane_colors(lay.lanes), critical)
        _png_axes(ax, lay, trace)
        fig.tight_layout()
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)
    return out
