"""Synchronous vs. asynchronous training on the default example, side by side in one run (issue 16).

Runs examples/countdown (its config and workflow: model, data, warm-up, recipe) once per mode, one after the
other in this process through the real services: `sync`, `one_step_off`, `async` with max_staleness 1 and 2
(same seeds). For each it prints wall-clock from the start of RL (the step-0 evaluation's end) to the first
held-out evaluation at or above the accuracy `sync` ends at, the ratio of that time to sync's, the mean
trainer- and rollout-idle fractions per step, the consumed samples' staleness, and the final held-out
accuracy. Target (issue 16): the best asynchronous mode reaches sync's final accuracy in <= 0.7x sync's time
and ends no lower than sync - 0.05.

Run: `.venv/bin/python bench/async/run.py [--steps 60] [--eval-every 5] [--prompts 128] [--tis-cap C]
[--mis-cap M] [--use-ray]`
(from the repository root; the example's model and data are built under runs/ on first use). Each mode
costs about what `make run` costs (minutes on 2 cores); --steps and --prompts shrink it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the example's modules (data generator, reward)

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb  # noqa: E402
from meshrl.scheduler.jobs import JobManager  # noqa: E402

EXAMPLE = ROOT / "examples" / "countdown"
MODES = {
    "sync": {"mode": "sync"},
    "one_step_off": {"mode": "one_step_off"},
    "async_eta1": {"mode": "async", "max_staleness": 1},
    "async_eta2": {"mode": "async", "max_staleness": 2},
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="RL steps per mode (the example's 60)")
    p.add_argument("--eval-every", type=int, default=5, help="held-out evaluation every K steps")
    p.add_argument("--prompts", type=int, default=0, help="prompts per step (0: the example's)")
    p.add_argument("--warmup-steps", type=int, default=-1, help="supervised warm-up steps (-1: the example's)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {list(MODES)}")
    p.add_argument(
        "--tis-cap",
        type=float,
        default=0.0,
        help="algorithm.loss.tis_cap for every mode (0: the mode default: off in sync, 2 in the async modes)",
    )
    p.add_argument(
        "--mis-cap",
        type=float,
        default=0.0,
        help="algorithm.loss.mis_cap for every mode (0: the mode default: off in sync, 4 in the async modes)",
    )
    p.add_argument("--use-ray", action="store_true", help="services as Ray actors (default: plain processes)")
    p.add_argument("--out", default="", help="write the figures as JSON here too")
    return p.parse_args(argv)


def job_yaml(a: argparse.Namespace, mode: str, run_root: Path) -> str:
    cfg = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    cfg["job"].update(name=f"bench-{mode.replace('_', '-')}", steps=a.steps, run_root=str(run_root))
    for section, field in (("model", "path"), ("data", "train"), ("data", "eval")):
        cfg[section][field] = str(ROOT / cfg[section][field])  # shared by every mode: built once
    cfg["eval"]["every"] = a.eval_every
    cfg["checkpoint"] = {"every": 0}
    cfg["services"] = {**cfg.get("services", {}), "use_ray": a.use_ray}
    cfg["training"] = MODES[mode]
    if a.prompts:
        cfg["data"]["prompts_per_step"] = a.prompts
    for name, value in (("tis_cap", a.tis_cap), ("mis_cap", a.mis_cap)):
        if value:
            cfg["algorithm"].setdefault("loss", {})[name] = value
    if a.warmup_steps >= 0:
        cfg["warmup"]["steps"] = a.warmup_steps
    return yaml.safe_dump(cfg)


def run_mode(a: argparse.Namespace, mode: str, run_root: Path) -> dict:
    jobs = JobManager()
    workflow = (EXAMPLE / "workflow.yaml").read_text()
    record = jobs.create(workflow, job_yaml(a, mode, run_root), [])
    jobs.run(record)
    if record.state != spb.JOB_STATE_SUCCEEDED:
        raise SystemExit(f"{mode}: the job ended {spb.JobState.Name(record.state)}: {record.error}")
    evals = []  # (step, accuracy, wall time of the evaluation's end)
    for e in record.events.read(0, 0)[0]:
        if e.WhichOneof("body") == "metrics" and "eval/accuracy" in e.metrics.metrics:
            evals.append((e.metrics.step, e.metrics.metrics["eval/accuracy"], e.time))
    steps = [json.loads(line) for line in record.runner.run.metrics_file.read_text().splitlines()]
    cfg = record.runner.cfg
    lags = [k for m in steps for k in m if k.startswith("async/staleness_") and k[-1].isdigit()]
    staleness = {k.rsplit("_", 1)[1]: sum(m.get(k, 0.0) for m in steps) for k in sorted(set(lags))}
    return {
        "evals": evals,
        "final": evals[-1][1],
        "rl_seconds": evals[-1][2] - evals[0][2],
        "trainer_idle": statistics.mean(m["async/trainer_idle_fraction"] for m in steps),
        "rollout_idle": statistics.mean(m["async/rollout_idle_fraction"] for m in steps),
        "step_seconds": statistics.median(m["time/step"] for m in steps),
        "staleness": staleness,
        "dropped": sum(m.get("async/dropped_groups", 0.0) for m in steps),
        "stream_max": max((m.get("async/stream_groups_max", 0.0) for m in steps), default=0.0),
        "stream_bound": float(cfg.training.stream_groups or (cfg.training.staleness + 1) * cfg.data.prompts_per_step),
        "regenerated": sum(m.get("async/regenerated_groups", 0.0) for m in steps),
    }


def seconds_to(result: dict, target: float) -> float | None:
    start = result["evals"][0][2]
    for _step, accuracy, when in result["evals"][1:]:
        if accuracy >= target - 1e-9:
            return when - start
    return None


def main(argv=None) -> int:
    a = parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or "sync" not in modes:
        raise SystemExit(f"--modes: {unknown or 'sync is missing'}; choose from {list(MODES)} (sync included)")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mr-async-") as tmp:
        for mode in modes:
            print(f"running {mode} ...", flush=True)
            results[mode] = run_mode(a, mode, Path(tmp))
    target = results["sync"]["final"]
    base = seconds_to(results["sync"], target)
    print(f"\n{a.steps} RL steps per mode, evaluation every {a.eval_every}; target: sync's final accuracy {target:.3f}")
    head = f"{'mode':<14}{'to target s':>12}{'x sync':>8}{'RL s':>8}{'step s':>8}{'trainer idle':>14}"
    print(head + f"{'rollout idle':>14}{'final acc':>11}  staleness (groups by lag), dropped, stream max / bound")
    for mode, r in results.items():
        t = seconds_to(r, target)
        ratio = f"{t / base:.2f}" if t is not None and base else "-"
        print(f"{mode:<14}{(f'{t:.1f}' if t is not None else 'never'):>12}{ratio:>8}{r['rl_seconds']:>8.1f}"
              f"{r['step_seconds']:>8.2f}{r['trainer_idle']:>14.2f}{r['rollout_idle']:>14.2f}{r['final']:>11.3f}"
              f"  {r['staleness'] or '-'}, {r['dropped']:.0f}, {r['stream_max']:.0f} / {r['stream_bound']:.0f}")  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
