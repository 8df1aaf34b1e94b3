"""The trace viewer: renders the JSONL span files of a run without a collector.

`trace_main(argv)` is `meshrl trace RUN_DIR --step N | --summary` (hooked into the meshrl CLI by
meshrl.scheduler.cli); the modules beside it load traces (model), find the critical path, print
the waterfall, draw the HTML/PNG timeline and summarise time per node and service.
"""

from meshrl.scheduler.traceview.cli import trace_main
from meshrl.scheduler.traceview.critical_path import critical_path
from meshrl.scheduler.traceview.model import SpanNode, Trace, build_traces, find_step, load_run, step_traces
from meshrl.scheduler.traceview.summary import Summary, render_summary, summarize
from meshrl.scheduler.traceview.timeline import render_html, write_html, write_png
from meshrl.scheduler.traceview.waterfall import format_duration, render_waterfall

__all__ = [
    "SpanNode",
    "Summary",
    "Trace",
    "build_traces",
    "critical_path",
    "find_step",
    "format_duration",
    "load_run",
    "render_html",
    "render_summary",
    "render_waterfall",
    "step_traces",
    "summarize",
    "trace_main",
    "write_html",
    "write_png",
]
