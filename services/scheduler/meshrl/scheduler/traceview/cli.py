"""`meshrl trace RUN_DIR [--step N | --summary | --trace-id ID]`: look at a run's traces without a
collector. The `meshrl` CLI (meshrl.scheduler.cli) hands its argv to `trace_main`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from meshrl.common.errors import MeshrlError, NotFound
from meshrl.scheduler.traceview.critical_path import critical_path
from meshrl.scheduler.traceview.model import Trace, find_step, load_run, output_folder, step_traces
from meshrl.scheduler.traceview.summary import render_summary, summarize
from meshrl.scheduler.traceview.timeline import write_html, write_png
from meshrl.scheduler.traceview.waterfall import format_duration, render_waterfall


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="meshrl trace",
        description="Render the traces of a run (RUN_DIR/traces/*.jsonl, written by telemetry.exporter=file).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run folder, its traces/ folder, or one .jsonl span file")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--step", type=int, metavar="N", help="waterfall and timeline of training step N")
    what.add_argument("--trace-id", metavar="ID", help="waterfall and timeline of one trace (hex id or a prefix)")
    what.add_argument("--summary", action="store_true", help="time per node and per service across steps")
    p.add_argument("--html", metavar="PATH", help="where to write the HTML timeline (default: next to the span files)")
    p.add_argument("--png", metavar="PATH", help="where to write the PNG timeline (default: next to the span files)")
    p.add_argument("--no-html", action="store_true", help="do not write the HTML timeline")
    p.add_argument("--no-png", action="store_true", help="do not write the PNG timeline")
    p.add_argument("--json", metavar="PATH", help="with --summary: also write the summary as JSON")
    p.add_argument("--width", type=int, help="waterfall width in columns (default: the terminal's)")
    return p


def _list(traces: list[Trace]) -> str:
    if not traces:
        return "no traces"
    lines = [f"{'step':>6}  {'trace id':<32}  {'duration':>10}  {'spans':>6}  {'errors':>6}  root"]
    for t in traces:
        step = "-" if t.step is None else str(t.step)
        lines.append(
            f"{step:>6}  {t.trace_id:<32}  {format_duration(t.duration_ns):>10}  {len(t.nodes):>6}  "
            f"{len(t.errors):>6}  {t.main_root.name}"
        )
    lines.append("")
    lines.append("show one with --step N (or --trace-id ID); --summary for time per node and service")
    return "\n".join(lines)


def _one(traces: list[Trace], args: argparse.Namespace) -> Trace:
    if args.step is not None:
        return find_step(traces, args.step)
    matches = [t for t in traces if t.trace_id.startswith(args.trace_id.lower())]
    if len(matches) != 1:
        problem = "no trace" if not matches else f"{len(matches)} traces"
        raise NotFound(f"{problem} with id starting {args.trace_id!r}; run without --trace-id to list them")
    return matches[0]


def _show(trace: Trace, args: argparse.Namespace) -> None:
    critical = critical_path(trace)
    width = args.width or shutil.get_terminal_size((140, 40)).columns
    print(render_waterfall(trace, critical, width=width))
    stem = f"step-{trace.step}" if trace.step is not None else f"trace-{trace.trace_id[:16]}"
    folder = output_folder(args.run_dir)
    written = []
    if not args.no_html:
        written.append(write_html(trace, args.html or folder / f"{stem}.html", critical))
    if not args.no_png:
        written.append(write_png(trace, args.png or folder / f"{stem}.png", critical))
    for path in written:
        print(f"wrote {path}")


def trace_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `meshrl trace`; returns the exit code (0 ok, 1 nothing to show)."""
    args = _parser().parse_args(argv)
    try:
        traces = load_run(args.run_dir)
        if args.summary:
            summary = summarize(step_traces(traces))
            print(render_summary(summary))
            if args.json:
                Path(args.json).write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
                print(f"wrote {args.json}")
        elif args.step is not None or args.trace_id:
            _show(_one(traces, args), args)
        else:
            print(_list(traces))
    except MeshrlError as exc:
        print(f"meshrl trace: {exc}", file=sys.stderr)
        return 1
    return 0
