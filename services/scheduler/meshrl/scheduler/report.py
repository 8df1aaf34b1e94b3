"""Plots and the HTML report of a run: reward and evaluation curves, step-time breakdown by
node. Written at the end of a run (and by `meshrl report RUN_DIR`), read by people.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from meshrl.scheduler.rundir import RunDir


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(run: RunDir) -> Path:
    plt = _plt()
    metrics = run.read_jsonl(run.metrics_file)
    evals = run.read_jsonl(run.eval_file)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = [m["step"] for m in metrics]
    rewards = [m.get("reward/mean") or 0.0 for m in metrics]
    axes[0].plot(steps, rewards, color="C0", alpha=0.35, lw=1, label="train reward (mean over samples)")
    window = max(1, min(10, len(rewards) // 5))
    smooth = [
        sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
        for i in range(len(rewards))
    ]
    axes[0].plot(steps, smooth, color="C0", lw=2.5, label=f"moving average ({window} steps)")
    accuracy = [m.get("reward/accuracy") for m in metrics]
    if any(a is not None and abs(a - r) > 1e-9 for a, r in zip(accuracy, rewards)):
        axes[0].plot(steps, accuracy, color="C1", lw=1, label="train accuracy")
    axes[0].set(title="Training reward", xlabel="RL step", ylabel="reward")
    axes[0].legend()
    axes[0].grid(alpha=0.3)
    axes[1].plot([e["step"] for e in evals], [e.get("eval/accuracy") for e in evals], marker="o", color="C2")
    axes[1].set(title="Held-out greedy accuracy", xlabel="RL step", ylabel="accuracy", ylim=(0, 1))
    axes[1].grid(alpha=0.3)
    fig.tight_layout()
    out = run.plots / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


STEP = "time/step"
REST = "rest"  # the step's time outside its nodes: weight publication, deletions, waits between nodes


def step_parts(metrics: dict[str, float]) -> dict[str, float]:
    """One step's wall time (`time/step`) in parts that sum to it: each node's time (`time/<node>`) and the rest.
    Nodes that ran side by side can add up to more than the step: their parts are then their shares of it (each
    scaled by step / sum) and the rest is 0. Empty for a row without `time/step`."""
    step = metrics.get(STEP)
    if step is None:
        return {}
    nodes = {k.removeprefix("time/"): v or 0.0 for k, v in metrics.items() if k.startswith("time/") and k != STEP}
    busy = sum(nodes.values())
    scale = step / busy if busy > step else 1.0
    return {**{k: v * scale for k, v in sorted(nodes.items())}, REST: max(0.0, step - busy)}


def plot_step_times(run: RunDir) -> Path:
    plt = _plt()
    rows = run.read_jsonl(run.metrics_file)
    parts, steps = [step_parts(m) for m in rows], [m["step"] for m in rows]
    labels = list(dict.fromkeys(k for p in parts for k in p if k != REST)) + [REST]
    fig, ax = plt.subplots(figsize=(11, 4))
    bottom = [0.0] * len(parts)
    for label in labels:
        values = [p.get(label, 0.0) for p in parts]
        ax.bar(steps, values, bottom=bottom, label=label, color="0.75" if label == REST else None)
        bottom = [b + v for b, v in zip(bottom, values)]
    title = "Step time: each node and the rest (a bar is the step's wall time)"
    ax.set(title=title, xlabel="RL step", ylabel="seconds")
    ax.legend(fontsize=8, ncol=4)
    fig.tight_layout()
    out = run.plots / "step_times.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_report(run: RunDir, summary: dict) -> Path:
    images = [plot_curves(run), plot_step_times(run)]
    imgs = "".join(
        f'<img src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}" style="max-width:100%">'
        for p in images
    )
    rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>" for k, v in summary.items())
    last = run.read_jsonl(run.metrics_file)[-1:] or [{}]
    metric_rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>" for k, v in sorted(last[0].items()))
    run.report_file.write_text(
        "<!doctype html><meta charset=utf-8><title>meshrl run</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{padding:2px 10px;border-bottom:1px solid #ddd}</style>"
        f"<h1>meshrl run {html.escape(run.root.name)}</h1><h2>Summary</h2><table>{rows}</table>"
        f"<h2>Curves</h2>{imgs}<h2>Last step's metrics</h2><table>{metric_rows}</table>"
    )
    run.summary_file.write_text(json.dumps(summary, indent=2))
    return run.report_file
