"""The default GRPO example through the services with the actor at TP=1 and at TP=2, same config and seed.

Runs `meshrl run examples/countdown/workflow.yaml` once per layout, one after the other in this process (each
job's services are plain child processes: data buffer with embedded Redis, trainer with its TP ranks, rollout
replica), and prints held-out greedy accuracy at every evaluation side by side, the mean training reward per
block of steps, the trainer-vs-engine log-prob gap and seconds per RL step. The same seed gives the same model,
data and sampling order, so the two curves differ only by the layout's floating-point rounding (which the
sampled rollouts amplify over the steps).
Run: nice -n 10 .venv/bin/python bench/trainer/grpo_tp.py [--steps 60] [--eval-every 10] [--layouts 1,2]
(from the repository root; about 3 min per layout on 2 idle cores at 60 steps, TP=2 slower).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = "examples/countdown/workflow.yaml"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="RL steps of each run (the example's default: 60)")
    p.add_argument("--eval-every", type=int, default=10, help="held-out evaluation every this many steps")
    p.add_argument("--layouts", default="1,2", help="tensor-parallel sizes to run, in order")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-root", default="", help="folder of the runs (default: a new temporary folder)")
    p.add_argument("--report-only", action="store_true", help="print the report of the runs already in --run-root")
    return p.parse_args(argv)


def read_run(root: Path, seconds: float) -> dict:
    (run,) = [p for p in root.iterdir() if (p / "eval.jsonl").exists()]
    read = lambda name: [json.loads(line) for line in (run / name).read_text().splitlines() if line.strip()]  # noqa: E731
    return {"evals": read("eval.jsonl"), "metrics": read("metrics.jsonl"), "seconds": seconds, "run": str(run)}


def run_layout(tp: int, args, run_root: Path) -> dict:
    """One `meshrl run` of the example at TP=tp; returns its eval and metrics records and wall time."""
    root = run_root / f"tp{tp}"
    sets = {
        "job.name": f"countdown-tp{tp}",
        "job.steps": args.steps,
        "job.seed": args.seed,
        "job.run_root": str(root),
        "eval.every": args.eval_every,
        "trainer.tensor_parallel": tp,
        "services.use_ray": "false",
        "checkpoint.every": 0,
    }
    cmd = [sys.executable, "-m", "meshrl.scheduler.cli", "run", WORKFLOW, "--no-progress"]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"TP={tp} run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return read_run(root, seconds)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def report(results: dict[int, dict], block: int) -> None:
    layouts = list(results)
    print("held-out greedy accuracy (eval/accuracy) per evaluation:")
    print("  step  " + "  ".join(f"TP={tp:<5d}" for tp in layouts))
    steps = sorted({e["step"] for r in results.values() for e in r["evals"]})
    for step in steps:
        row = []
        for tp in layouts:
            acc = [e.get("eval/accuracy") for e in results[tp]["evals"] if e["step"] == step]
            row.append(f"{acc[-1]:.3f}  " if acc and acc[-1] is not None else "  -    ")
        print(f"  {step:4d}  " + "  ".join(row))
    print(f"mean training reward per {block} steps, and the trainer-engine log-prob gap (mean of steps):")
    for tp in layouts:
        metrics = results[tp]["metrics"]
        rewards = [m.get("reward/mean") for m in metrics if m.get("reward/mean") is not None]
        blocks = [f"{mean(rewards[i : i + block]):.3f}" for i in range(0, len(rewards), block)]
        gap = [m["async/logprob_gap_lag0"] for m in metrics if m.get("async/logprob_gap_lag0") is not None]
        step = [m["time/step"] for m in metrics if m.get("time/step") is not None]
        print(
            f"  TP={tp}: reward {' '.join(blocks)}   gap {mean(gap):.2e}   {mean(step):.1f} s/step   "
            f"{results[tp]['seconds']:.0f} s in all ({results[tp]['run']})"
        )


def main(argv=None) -> None:
    args = parse_args(argv)
    run_root = Path(args.run_root) if args.run_root else Path(tempfile.mkdtemp(prefix="grpo-tp-"))
    results = {}
    for tp in [int(x) for x in args.layouts.split(",")]:
        if args.report_only:
            results[tp] = read_run(run_root / f"tp{tp}", float("nan"))
            continue
        results[tp] = run_layout(tp, args, run_root)
        print(f"TP={tp}: done in {results[tp]['seconds']:.0f} s", flush=True)
    report(results, block=max(args.eval_every, 1))


if __name__ == "__main__":
    main()
