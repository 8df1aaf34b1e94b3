"""Tracing on vs off on a real job: the `--job` mode of bench/tracing/bench_tracing.py.

Two GRPO jobs run in this process at the same time, each with its own real services (data buffer,
trainer, rollout replicas as plain processes): one with `telemetry.exporter: file` (every service and
the scheduler write spans to RUN_DIR/traces), one with `exporter: none`. Once both have started, their
steps take turns, one at a time, in ABBA order (off-on, on-off, ...), so drift in the machine's load
falls on both; the scheduler process sets its tracer up for the mode of the step about to run. A step's
time is the job's own `time/step` plus, for the traced job, flushing the scheduler's spans to the file
(counted, so the scheduler's export cost is not hidden in a background thread). The first --warmup
pairs are dropped; medians, means and the median of pair ratios are printed side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
from tiny_task import add_task_arguments, make_task  # noqa: E402

from meshrl.common import telemetry  # noqa: E402
from meshrl.common.telemetry import TelemetryConfig, read_span_files  # noqa: E402
from meshrl.common.telemetry.attributes import STEP_SPAN_PREFIX  # noqa: E402

if TYPE_CHECKING:  # the scheduler and trainer are imported by `run` (bench_tracing imports this module always)
    from meshrl.scheduler.jobs import JobRecord

MODES = ("off", "on")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--job mode (a real GRPO job, tracing on vs off)")
    g.add_argument("--pairs", type=int, default=12, help="measured steps per mode (after the warm-up)")
    g.add_argument("--warmup", type=int, default=2, help="steps per mode dropped before measuring")
    g.add_argument("--replicas", type=int, default=2, help="rollout replicas per job")
    add_task_arguments(g, prompts=8, n=4, max_tokens=16)
    g.add_argument("--workdir", default=None, help="keep the model, data and run folders here")


def job_yaml(a: argparse.Namespace, task: dict[str, str], run_root: Path, mode: str) -> str:
    cfg = {
        "job": {"name": f"bench-trace-{mode}", "steps": a.warmup + a.pairs, "run_root": str(run_root)},
        "model": {"path": task["model"]},
        "data": {"train": task["train"], "prompts_per_step": a.prompts},
        "rollout": {"replicas": a.replicas, "n": a.n, "max_tokens": a.max_tokens},
        "eval": {"every": 0},
        "checkpoint": {"every": 0},
        "services": {"use_ray": False},
        "telemetry": {"exporter": "file" if mode == "on" else "none"},
    }
    return yaml.safe_dump(cfg)


class TakeTurns:
    """Lets the jobs' steps run one at a time in a fixed order, none before every job reached its first
    step (so no step runs while the other job still starts its services); each blocks until its turn.
    A job that fails aborts the others instead of leaving them waiting.
    """

    def __init__(self, order: list[tuple[str, int]], timeout: float) -> None:
        self.order = order
        self.timeout = timeout
        self.turn = 0
        self.aborted: str | None = None
        self.ready: set[str] = set()
        self.modes = {m for m, _ in order}
        self.cond = threading.Condition()

    def wait(self, mode: str, step: int) -> None:
        mine = self.order.index((mode, step))
        with self.cond:
            self.ready.add(mode)
            self.cond.notify_all()

            def my_turn() -> bool:
                return (self.turn == mine and self.ready == self.modes) or self.aborted is not None

            if not self.cond.wait_for(my_turn, self.timeout):
                self.aborted = f"job '{mode}' waited {self.timeout:.0f}s for its step {step}"
            if self.aborted:
                self.cond.notify_all()
                raise RuntimeError(f"bench aborted: {self.aborted}")

    def done(self) -> None:
        with self.cond:
            self.turn += 1
            self.cond.notify_all()

    def wait_all(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.turn == len(self.order) or self.aborted, self.timeout)

    def abort(self, why: str) -> None:
        with self.cond:
            self.aborted = self.aborted or why
            self.cond.notify_all()


def take_turns(record: JobRecord, mode: str, turns: TakeTurns, rows: list[dict[str, float]], spans: Path) -> None:
    """Wraps the runner's step: wait for the turn, set the scheduler's tracer up for `mode`, time it.
    Appends the step's times to `rows`: `step` (the job's time/step + `flush`), the nodes' and weights'."""
    runner = record.runner
    step_fn = runner._train_step
    tracing = TelemetryConfig(exporter="file", path=str(spans)) if mode == "on" else TelemetryConfig()

    def one_step(svc, executor, publisher, *rest):
        turns.wait(mode, runner.step)
        try:
            telemetry.setup_telemetry("scheduler", tracing)
            metrics = step_fn(svc, executor, publisher, *rest)
            start = time.perf_counter()
            telemetry.force_flush()
            flush = time.perf_counter() - start
            telemetry.shutdown_telemetry()
            parts = {k: v for k, v in metrics.items() if k.startswith("time/") or k == "weights/seconds"}
            rows.append({**parts, "flush": flush, "step": metrics["time/step"] + flush})
        except BaseException as exc:
            telemetry.shutdown_telemetry()
            turns.abort(f"step {runner.step} of job '{mode}' raised {exc!r}")
            raise
        turns.done()
        if runner.step == runner.cfg.job.steps:
            turns.wait_all()  # neither job winds down while the other still steps
        return metrics

    runner._train_step = one_step


def spans_per_step(run_dir: Path) -> float:
    """Mean number of spans in the traces rooted at a `step N` span (all services)."""
    spans = read_span_files(sorted((run_dir / "traces").glob("*.jsonl")))
    steps = {s.trace_id for s in spans if s.parent_span_id is None and s.name.startswith(STEP_SPAN_PREFIX)}
    return sum(1 for s in spans if s.trace_id in steps) / max(1, len(steps))


def run(a: argparse.Namespace) -> dict:
    from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
    from meshrl.scheduler.jobs import JobManager
    from meshrl.scheduler.workflow import builtin_workflow_text

    tmp = None if a.workdir else tempfile.TemporaryDirectory(prefix="meshrl-bench-tracing-job-")
    root = Path(a.workdir or tmp.name)
    root.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    task = make_task(root, a.hidden, a.layers)
    steps = a.warmup + a.pairs
    order = [(m, s) for s in range(1, steps + 1) for m in (MODES if s % 2 else MODES[::-1])]
    turns = TakeTurns(order, timeout=900.0)
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    jobs = JobManager(max_concurrent=2)
    records = {m: jobs.create(builtin_workflow_text("grpo"), job_yaml(a, task, root / "runs", m), []) for m in MODES}
    for mode, record in records.items():
        take_turns(record, mode, turns, rows[mode], record.runner.run.traces / "scheduler.jsonl")
    started = time.perf_counter()
    for record in records.values():
        jobs.start(record)
    while any(r.thread.is_alive() for r in records.values()):
        for mode, record in records.items():
            if not record.thread.is_alive() and record.state != spb.JOB_STATE_SUCCEEDED:
                turns.abort(f"the job with tracing {mode} ended in state {spb.JobState.Name(record.state)}")
        time.sleep(0.5)
    for mode, record in records.items():
        if record.state != spb.JOB_STATE_SUCCEEDED:
            raise SystemExit(f"the job with tracing {mode} failed:\n{record.error}")
    seconds = time.perf_counter() - started
    load_end = os.getloadavg()

    kept = {m: [r["step"] for r in v[a.warmup :]] for m, v in rows.items()}
    med = {m: statistics.median(v) for m, v in kept.items()}
    mean = {m: statistics.fmean(v) for m, v in kept.items()}
    pairs = [on / off for off, on in zip(kept["off"], kept["on"], strict=True)]
    per_step = spans_per_step(records["on"].runner.run.root)
    print(
        f"\nGRPO job, {a.prompts} prompts x n={a.n}, max {a.max_tokens} tokens, model hidden {a.hidden} x "
        f"{a.layers} layers, {a.replicas} rollout replicas (processes); {a.pairs} measured steps per mode after "
        f"{a.warmup} warm-up, in alternating ABBA turns; {per_step:.0f} spans per traced step"
    )
    print(f"{'':<24}{'tracing off':>14}{'tracing on (file)':>20}{'ratio on/off':>14}")
    for label, v in (("median step time", med), ("mean step time", mean)):
        print(f"{label:<24}{v['off'] * 1e3:>11.1f} ms{v['on'] * 1e3:>17.1f} ms{v['on'] / v['off']:>14.3f}")
    print(f"{'median of pair ratios':<24}{'':>14}{'':>20}{statistics.median(pairs):>14.3f}")
    print("target: median ratio <= 1.03")
    print("\nmedians per part of the step (the nodes overlap; flush: the scheduler's spans written at step end)")
    for key in sorted(set(rows["off"][0]) - {"step", "time/step"}):
        off, on = (statistics.median(r[key] for r in rows[m][a.warmup :]) for m in MODES)
        ratio = f"{on / off:>14.3f}" if off > 1e-4 else ""
        print(f"  {key.removeprefix('time/'):<22}{off * 1e3:>11.1f} ms{on * 1e3:>17.1f} ms{ratio}")
    print(
        f"both jobs {seconds:.0f}s; load average at start {tuple(round(x, 2) for x in load_start)}, "
        f"at end {tuple(round(x, 2) for x in load_end)}; {os.cpu_count()} cores"
    )
    out = {"rows": rows, "median": med, "mean": mean, "pair_ratios": pairs, "spans_per_step": per_step}
    if tmp is not None:
        tmp.cleanup()
    return out
