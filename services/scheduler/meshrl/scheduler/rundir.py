"""The run folder: config, workflow, metrics (jsonl), events, checkpoints, published weights,
traces, logs per service, plots and the HTML report. One place names every path.

A checkpoint counts once its job-level COMPLETE marker is written (durably, after job_state.json, holding that
file's digest); resume takes the newest step whose marker and job state agree and skips a torn one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from meshrl.common.durable_file import write_durably

log = logging.getLogger(__name__)
JOB_STATE = "job_state.json"
COMPLETE = "COMPLETE"


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

    @staticmethod
    def mark_checkpoint(path: Path, job_state: dict) -> None:
        """The job's part of a checkpoint, once every role's is saved: job_state.json, then COMPLETE naming its
        digest, each written durably (a crash leaves the step without a marker, and resume takes the one before)."""
        raw = json.dumps(job_state).encode()
        write_durably(path / JOB_STATE, raw)
        write_durably(path / COMPLETE, json.dumps({JOB_STATE: hashlib.sha256(raw).hexdigest()}).encode())

    @staticmethod
    def checkpoint_problem(path: Path) -> str:
        """Why the checkpoint at `path` cannot be resumed from ('' when it can)."""
        try:
            raw = (path / JOB_STATE).read_bytes()
            marker = (path / COMPLETE).read_bytes()
            state = json.loads(raw)
        except (OSError, ValueError) as exc:
            return f"{JOB_STATE} or {COMPLETE} is unreadable ({exc})"
        if not isinstance(state, dict) or "step" not in state:
            return f"{JOB_STATE} holds no step"
        if not marker:  # written before markers held a digest
            return ""
        try:
            expected = json.loads(marker).get(JOB_STATE)
        except (ValueError, AttributeError):
            return f"{COMPLETE} is torn"
        if expected != hashlib.sha256(raw).hexdigest():
            return f"{JOB_STATE} does not match the digest in {COMPLETE}"
        return ""

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint; a torn one is logged and skipped for the one before it."""
        for path in sorted((p.parent for p in self.checkpoints.glob(f"step_*/{COMPLETE}")), reverse=True):
            problem = self.checkpoint_problem(path)
            if not problem:
                return path
            log.warning("checkpoint %s is not resumable (%s): trying the one before it", path, problem)
        return None

    def published_versions(self) -> list[int]:
        """Weight versions already published in the run folder (complete ones, v000001/...)."""
        return [int(p.name[1:]) for p in self.weights.glob("v[0-9]*") if p.name[1:].isdigit()]

    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"
