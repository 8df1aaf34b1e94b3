"""The run folder: config, workflow, metrics (jsonl), events, checkpoints, published weights,
traces, logs per service, plots and the HTML report. One place names every path.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass
class RunDir:
    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        for sub in (self.logs, self.checkpoints, self.weights, self.traces, self.plots):
            sub.mkdir(parents=True, exist_ok=True)

    logs = property(lambda self: self.root / "logs")
    checkpoints = property(lambda self: self.root / "checkpoints")
    weights = property(lambda self: self.root / "weights")
    traces = property(lambda self: self.root / "traces")
    plots = property(lambda self: self.root / "plots")
    metrics_file = property(lambda self: self.root / "metrics.jsonl")
    eval_file = property(lambda self: self.root / "eval.jsonl")
    events_file = property(lambda self: self.root / "events.jsonl")
    config_file = property(lambda self: self.root / "config.yaml")
    workflow_file = property(lambda self: self.root / "workflow.yaml")
    report_file = property(lambda self: self.root / "report.html")
    summary_file = property(lambda self: self.root / "summary.json")

    def write_config(self, config: dict, workflow_text: str) -> None:
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        self.workflow_file.write_text(workflow_text)

    @staticmethod
    def _append(path: Path, record: dict) -> None:
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in record.items()}
        with open(path, "a") as f:
            f.write(json.dumps(clean) + "\n")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._append(self.metrics_file, {"step": step, **metrics})

    def log_eval(self, step: int, metrics: dict[str, float]) -> None:
        self._append(self.eval_file, {"step": step, **metrics})

    @staticmethod
    def read_jsonl(path: Path) -> list[dict]:
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        """On resume: drop records past the checkpoint's step so the curves continue where they stopped."""
        for path in (self.metrics_file, self.eval_file):
            kept = [r for r in self.read_jsonl(path) if r["step"] <= step]
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def latest_checkpoint(self) -> Path | None:
        done = sorted(p.parent for p in self.checkpoints.glob("step_*/COMPLETE"))
        return done[-1] if done else None

    def published_versions(self) -> list[int]:
        """Weight versions already published in the run folder (complete ones, v000001/...)."""
        return [int(p.name[1:]) for p in self.weights.glob("v[0-9]*") if p.name[1:].isdigit()]

    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"
