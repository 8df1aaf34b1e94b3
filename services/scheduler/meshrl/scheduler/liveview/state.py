"""What the live view shows of one run, read from its run folder while the job writes it:
the job state, each DAG node's state in the latest step (a waterfall of start and duration),
the reward / accuracy / held-out curves, the share of groups whose samples all scored alike and the entropy of
the sampled tokens (a start RL cannot learn from), each side's busy share of every step (trainer and rollout:
where the time goes, and what overlap could fill), and the weight version the replicas serve.
Called by liveview.server for /api/runs/<name>; reads only files RunDir names.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from meshrl.scheduler.rundir import RunDir


def _jsonl(path: Path) -> list[dict]:
    """Complete lines only: the job may be writing the last one right now."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _nodes(events: list[dict], step: int) -> list[dict]:
    """Node id -> state, start (seconds after the step's first event) and duration, for `step`."""
    nodes: dict[str, dict] = {}
    first = None
    for event in events:
        node = event.get("node")
        if node is None or int(node.get("step", 0)) != step:
            continue
        first = event["time"] if first is None else first
        entry = nodes.setdefault(node["nodeId"], {"id": node["nodeId"], "start": event["time"] - first})
        entry["state"] = node.get("state", "NODE_STATE_UNSPECIFIED").removeprefix("NODE_STATE_")
        entry["seconds"] = float(node.get("seconds", 0.0))
        if node.get("error"):
            entry["error"] = node["error"].splitlines()[-1]
    return list(nodes.values())


def run_state(run_dir: Path) -> dict:
    run = RunDir.__new__(RunDir)  # no mkdir: the view only reads
    run.root = Path(run_dir).resolve()
    events = _jsonl(run.events_file)
    metrics = _jsonl(run.metrics_file)
    evals = _jsonl(run.eval_file)
    states = [e["state"]["state"].removeprefix("JOB_STATE_") for e in events if "state" in e]
    node_steps = [int(e["node"].get("step", 0)) for e in events if "node" in e]
    config = yaml.safe_load(run.config_file.read_text()) if run.config_file.exists() else {}
    last = metrics[-1] if metrics else {}
    return {
        "name": run.root.name,
        "state": states[-1] if states else "PENDING",
        "step": last.get("step", 0),
        "total_steps": (config.get("job") or {}).get("steps"),
        "running_step": max(node_steps, default=0),
        "nodes": _nodes(events, max(node_steps, default=0)),
        "curves": {
            "step": [m["step"] for m in metrics],
            "reward": [m.get("reward/mean") for m in metrics],
            "accuracy": [m.get("reward/accuracy") for m in metrics],
            # what tells early that RL cannot learn from this start: groups with one reward, sure samples
            "zero_variance_groups": [m.get("reward/zero_variance_groups") for m in metrics],
            "entropy": [m.get("actor/entropy") for m in metrics],
            # each side's busy share of the step (step/pacing/pipeline.py IdleMeter): the rest is idle
            "trainer_busy": [m.get("busy/trainer") for m in metrics],
            "rollout_busy": [m.get("busy/rollout") for m in metrics],
        },
        "eval": {"step": [e["step"] for e in evals], "accuracy": [e.get("eval/accuracy") for e in evals]},
        "weights": {"version": last.get("weights/version"), "stale_replicas": last.get("weights/stale_replicas")},
        "log": [e["log"] for e in events if "log" in e][-8:],
    }


def list_runs(root: Path) -> list[str]:
    """Run folders under `root`, newest first (a folder with events.jsonl or config.yaml)."""
    found = [p for p in Path(root).iterdir() if p.is_dir() and (p / "config.yaml").exists()] if root.exists() else []
    return [p.name for p in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)]
