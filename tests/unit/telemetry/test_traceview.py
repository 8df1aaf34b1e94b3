"""The trace viewer (`meshrl trace`) on a synthetic multi-service run and on spans written by the
real file exporter: span trees across files, waterfall order, critical path, HTML/PNG, summary."""

from __future__ import annotations

import json
import time
from xml.etree import ElementTree

from meshrl.common.telemetry import TelemetryConfig, setup_telemetry, shutdown_telemetry, tracer
from meshrl.common.telemetry.attributes import NODE_ID, STEP, node_span_name, step_span_name
from meshrl.scheduler.traceview import (
    critical_path,
    find_step,
    load_run,
    render_waterfall,
    step_traces,
    summarize,
    trace_main,
)
from meshrl.scheduler.traceview.summary import busy_ns

GEN = "meshrl.rollout.v1.RolloutService/Generate"
TRAIN = "meshrl.trainer.v1.TrainerService/TrainStep"
MS = 1_000_000


def _sid(step: int, n: int) -> str:
    return f"{step:08x}{n:08x}"


def test_trees_span_files_and_steps(synthetic_run):
    traces = load_run(synthetic_run)
    assert [t.step for t in traces] == [1, 2]
    trace = find_step(traces, 1)
    assert len(trace.roots) == 1 and trace.main_root.name == "step 1"
    assert trace.lanes == ["scheduler", "rollout/r0", "rollout/r1", "databuffer", "trainer"]
    server = trace.nodes[_sid(1, 11)]
    assert server.lane == "trainer" and server.parent.span_id == _sid(1, 10) and server.depth == 3
    assert trace.nodes[_sid(1, 13)].depth == 5  # databuffer Get under the trainer's client span
    assert trace.duration_ns == 1000 * MS
    assert [e.name for e in find_step(traces, 2).errors] == ["node reward"]


def test_critical_path_follows_what_the_step_waited_for(synthetic_run):
    trace = find_step(load_run(synthetic_run), 1)
    path = critical_path(trace)
    # step <- actor_train <- TrainStep (client, server) <- forward_backward <- Get; then reward; then
    # rollout <- the slower replica r0 (r1 ran in parallel and finished first).
    expected = {1, 9, 10, 11, 14, 12, 13, 8, 2, 3, 5, 6, 15}
    assert path == {_sid(1, n) for n in expected}


def test_waterfall_lists_spans_in_tree_order(synthetic_run):
    trace = find_step(load_run(synthetic_run), 2)
    text = render_waterfall(trace, critical_path(trace), width=140)
    lines = text.splitlines()
    assert lines[0].startswith(f"step 2  trace {2:032x}  1.00 s  15 spans  4 services")
    assert "1 error" in lines[0]
    body = [line for line in lines[3:] if line.strip() and not line.lstrip().startswith("└") and "|" in line]
    names = [line[2:].strip().split("  ")[0] for line in body]
    assert names == [
        "step 2",
        "node rollout",
        GEN,
        GEN,
        "meshrl.databuffer.v1.DataBufferService/Put",
        "meshrl.databuffer.v1.DataBufferService/Put",
        GEN,
        GEN,
        "node reward",
        "node actor_train",
        TRAIN,
        TRAIN,
        "meshrl.databuffer.v1.DataBufferService/Get",
        "meshrl.databuffer.v1.DataBufferService/Get",
        "trainer.forward_backward",
    ]
    by_name = {}
    for line in body:
        by_name.setdefault(line[2:].strip().split("  ")[0], []).append(line)
    assert by_name["step 2"][0].startswith(" *")
    assert by_name["node reward"][0].startswith("!*")
    assert "rollout/r1" in by_name[GEN][3] and not by_name[GEN][3].startswith(" *")
    assert "1.00 s" in by_name["step 2"][0] and "330.0 ms" in by_name["node actor_train"][0]
    error_line = lines[lines.index(by_name["node reward"][0]) + 1]
    assert "└ error: KeyError: rewards missing for group 4" in error_line
    # Bars share one axis: the step bar is full, actor_train starts at 65 % of it.
    step_bar = by_name["step 2"][0].split("|")[1]
    train_bar = by_name["node actor_train"][0].split("|")[1]
    assert step_bar.strip() == step_bar and "█" in step_bar
    assert abs(train_bar.index("█") / len(train_bar) - 0.65) < 0.02


def test_trace_main_step_writes_html_and_png(synthetic_run, capsys):
    assert trace_main([str(synthetic_run), "--step", "2", "--width", "150"]) == 0
    out = capsys.readouterr().out
    assert "step 2  trace" in out and "trainer.forward_backward" in out
    html_path = synthetic_run / "traces" / "step-2.html"
    png_path = synthetic_run / "traces" / "step-2.png"
    assert f"wrote {html_path}" in out and f"wrote {png_path}" in out
    html = html_path.read_text()
    for lane in ("scheduler", "rollout/r0", "rollout/r1", "trainer", "databuffer"):
        assert f">{lane}</text>" in html
    assert html.count('<g class="span') == 15
    assert html.count('class="span critical') == 13
    svg = ElementTree.fromstring(html[html.index("<svg") : html.index("</svg>") + 6])  # well-formed
    titles = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("node reward") and "ERROR: KeyError" in t for t in titles)
    assert any("meshrl.bytes = 4096" in t for t in titles)
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png_path.stat().st_size > 10_000


def test_trace_main_summary(synthetic_run, capsys, tmp_path):
    json_path = tmp_path / "summary.json"
    assert trace_main([str(synthetic_run), "--summary", "--json", str(json_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 steps (1..2), mean 1.00 s, max 1.00 s, 1 error span")
    data = json.loads(json_path.read_text())
    nodes = {n["name"]: n for n in data["nodes"]}
    assert nodes["rollout"]["mean_ns"] == 595 * MS and nodes["rollout"]["count"] == 2
    assert nodes["actor_train"]["total_ns"] == 2 * 330 * MS
    assert abs(nodes["reward"]["share"] - 100 / 2000) < 1e-9
    services = {s["name"]: s for s in data["services"]}
    assert services["scheduler"]["mean_ns"] == 1000 * MS
    assert services["rollout"]["mean_ns"] == 576 * MS  # union of r0 [12, 588] and r1 [12, 448]
    assert services["trainer"]["mean_ns"] == 316 * MS
    assert services["databuffer"]["mean_ns"] == (36 + 21) * MS
    assert [s["step"] for s in data["steps"]] == [1, 2]
    assert "node" in out and "actor_train" in out and "databuffer" in out


def test_busy_time_is_a_union():
    assert busy_ns([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25
    assert busy_ns([]) == 0


def test_listing_and_helpful_failures(synthetic_run, tmp_path, capsys):
    assert trace_main([str(synthetic_run)]) == 0
    assert "show one with --step N" in capsys.readouterr().out
    assert trace_main([str(synthetic_run), "--step", "9", "--no-png", "--no-html"]) == 1
    assert "no trace for step 9; steps with a trace: 1, 2" in capsys.readouterr().err
    assert trace_main([str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert trace_main([str(tmp_path / "empty")]) == 1
    assert "telemetry.exporter=file" in capsys.readouterr().err
    assert trace_main([str(synthetic_run), "--trace-id", "0000", "--no-png", "--no-html"]) == 1
    assert "2 traces with id starting '0000'" in capsys.readouterr().err
    assert trace_main([str(synthetic_run), "--trace-id", f"{2:032X}", "--no-png", "--no-html"]) == 0
    assert capsys.readouterr().out.startswith("step 2  trace")


def test_real_file_exporter_output_renders(tmp_path, capsys):
    path = tmp_path / "run" / "traces" / "scheduler.jsonl"
    setup_telemetry("scheduler", TelemetryConfig(exporter="file", path=str(path)))
    for step in (1, 2):
        with tracer().start_as_current_span(step_span_name(step), attributes={STEP: step}):
            for node in ("rollout", "train"):
                with tracer().start_as_current_span(node_span_name(node), attributes={NODE_ID: node}):
                    time.sleep(0.002)
    shutdown_telemetry()
    steps = step_traces(load_run(tmp_path / "run"))
    assert [t.step for t in steps] == [1, 2]
    summary = summarize(steps)
    assert sorted(n.name for n in summary.nodes) == ["rollout", "train"]
    assert all(n.count == 2 and n.mean_ns >= 2 * MS for n in summary.nodes)
    assert trace_main([str(tmp_path / "run"), "--step", "2", "--no-png"]) == 0
    out = capsys.readouterr().out
    assert out.index("step 2") < out.index("node rollout") < out.index("node train")
    assert (tmp_path / "run" / "traces" / "step-2.html").exists()
    assert not (tmp_path / "run" / "traces" / "step-2.png").exists()
