"""Colocated vs disaggregated GRPO on the default example, side by side in one run (issue 17).

Runs examples/countdown (its config and workflow: model, data, warm-up, recipe) twice through the real
services on Ray, one after the other in this process with the same seeds: `disaggregated` (the trainer and
the replica on bundles of their own) and `colocated` (`services.placement: colocated`: one bundle shared by
both, the replica asleep while the trainer works, meshrl.scheduler.step.job.colocate). For each it prints the
held-out greedy accuracy at every evaluation, the wall-clock of RL (step-0 evaluation's end to the last
evaluation's end) and the median step time; for the colocated run also the replica's resident memory awake
(before each release) and asleep (after it), the seconds spent releasing and resuming, the trainer's
offloaded bytes, and the bundle both services ran in.

Run: `.venv/bin/python bench/colocate/run.py [--steps 60] [--eval-every 10] [--prompts 128]` (from the
repository root; the example's model and data are built under runs/ on first use). Each placement costs
about what `make run` costs (minutes on 2 cores); --steps and --prompts shrink it. `--hidden H --layers L`
builds a bigger model of the same shape (e.g. 512 x 8, ~100 MiB of fp32 weights), so that the replica's
memory release shows above the ~400 MiB a replica process holds anyway (the example's model is ~0.4 MiB).
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
PLACEMENTS = ("disaggregated", "colocated")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="RL steps per placement (the example's 60)")
    p.add_argument("--eval-every", type=int, default=10, help="held-out evaluation every K steps")
    p.add_argument("--prompts", type=int, default=0, help="prompts per step (0: the example's)")
    p.add_argument("--warmup-steps", type=int, default=-1, help="supervised warm-up steps (-1: the example's)")
    p.add_argument("--hidden", type=int, default=0, help="build a model of this hidden size instead (0: the example's)")
    p.add_argument("--layers", type=int, default=0, help="and this many layers (with --hidden; 0: the example's)")
    p.add_argument("--placements", default=",".join(PLACEMENTS), help=f"comma-separated, from {list(PLACEMENTS)}")
    p.add_argument("--out", default="", help="write the figures as JSON here too")
    return p.parse_args(argv)


def job_yaml(a: argparse.Namespace, placement: str, run_root: Path) -> str:
    cfg = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    cfg["job"].update(name=f"bench-{placement}", steps=a.steps, run_root=str(run_root))
    for section, field in (("model", "path"), ("data", "train"), ("data", "eval")):
        cfg[section][field] = str(ROOT / cfg[section][field])  # shared by both placements: built once
    if a.hidden:  # a bigger model shows the replica's memory release above the process's own resident memory
        cfg["model"]["build"].update(hidden_size=a.hidden, num_layers=a.layers or cfg["model"]["build"]["num_layers"])
        cfg["model"]["path"] = str(
            ROOT / f"runs/models/countdown-qwen2-h{a.hidden}-l{cfg['model']['build']['num_layers']}"
        )
    cfg["eval"]["every"] = a.eval_every
    cfg["checkpoint"] = {"every": 0}
    cfg["services"] = {**cfg.get("services", {}), "use_ray": True, "placement": placement}
    if a.prompts:
        cfg["data"]["prompts_per_step"] = a.prompts
    if a.warmup_steps >= 0:
        cfg["warmup"]["steps"] = a.warmup_steps
    return yaml.safe_dump(cfg)


def run_placement(a: argparse.Namespace, placement: str, run_root: Path) -> dict:
    jobs = JobManager()
    record = jobs.create((EXAMPLE / "workflow.yaml").read_text(), job_yaml(a, placement, run_root), [])
    jobs.run(record)
    if record.state != spb.JOB_STATE_SUCCEEDED:
        raise SystemExit(f"{placement}: the job ended {spb.JobState.Name(record.state)}: {record.error}")
    evals, bundles = [], []  # (step, accuracy, wall time of the evaluation's end); the shared-bundle log line
    for e in record.events.read(0, 0)[0]:
        body = e.WhichOneof("body")
        if body == "metrics" and "eval/accuracy" in e.metrics.metrics:
            evals.append((e.metrics.step, e.metrics.metrics["eval/accuracy"], e.time))
        if body == "log" and "one bundle" in e.log:
            bundles.append(e.log)
    steps = [json.loads(line) for line in record.runner.run.metrics_file.read_text().splitlines()]

    def series(key: str) -> list[float]:
        return [m[key] for m in steps if key in m]

    return {
        "evals": [(s, acc) for s, acc, _ in evals],
        "rl_seconds": evals[-1][2] - evals[0][2],
        "step_seconds": statistics.median(m["time/step"] for m in steps),
        "rss_awake_mib": series("colocate/replica_rss_awake_mib"),
        "rss_asleep_mib": series("colocate/replica_rss_asleep_mib"),
        "release_seconds": series("colocate/release_seconds"),
        "resume_seconds": series("colocate/resume_seconds"),
        "offloaded_mib": series("colocate/trainer_offloaded_mib"),
        "bundle": bundles[0] if bundles else "",
        "median_seconds": {
            k: statistics.median(series(k))
            for k in sorted({k for m in steps for k in m})
            if k.startswith("time/") or k == "weights/seconds"
        },
    }


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def main(argv=None) -> int:
    a = parse_args(argv)
    placements = [p.strip() for p in a.placements.split(",") if p.strip()]
    if not placements or any(p not in PLACEMENTS for p in placements):
        raise SystemExit(f"--placements: choose from {list(PLACEMENTS)}")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mr-coloc-") as tmp:
        for placement in placements:
            print(f"running {placement} ...", flush=True)
            results[placement] = run_placement(a, placement, Path(tmp))
    print(f"\n{a.steps} RL steps per placement, evaluation every {a.eval_every}")
    print(f"{'placement':<15}{'RL s':>8}{'step s':>8}  held-out accuracy by step")
    for placement, r in results.items():
        curve = "  ".join(f"{s}:{acc:.3f}" for s, acc in r["evals"])
        print(f"{placement:<15}{r['rl_seconds']:>8.1f}{r['step_seconds']:>8.2f}  {curve}")
    for placement, r in results.items():
        parts = ", ".join(
            f"{k.replace('time/', '').replace('weights/seconds', 'publish')} {v:.2f}"
            for k, v in r["median_seconds"].items()
        )
        print(f"{placement:<15}median s per step: {parts}")
    if len(results) == 2:
        d, c = results["disaggregated"], results["colocated"]
        print(
            f"colocated / disaggregated RL wall-clock: {c['rl_seconds'] / d['rl_seconds']:.2f}x; final accuracy "
            f"{c['evals'][-1][1]:.3f} vs {d['evals'][-1][1]:.3f}"
        )
    c = results.get("colocated")
    if c:
        drop = [w - s for w, s in zip(c["rss_awake_mib"], c["rss_asleep_mib"], strict=True)]
        print(
            f"colocated replica RSS per step (median MiB): awake {_median(c['rss_awake_mib'])}, asleep "
            f"{_median(c['rss_asleep_mib'])}, drop {_median(drop)} (min {min(drop, default=0):.1f}, max "
            f"{max(drop, default=0):.1f})"
        )
        print(
            f"release s (median) {statistics.median(c['release_seconds'] or [0]):.3f}, resume s "
            f"{statistics.median(c['resume_seconds'] or [0]):.3f}, trainer offloaded MiB "
            f"{_median(c['offloaded_mib'])}; {c['bundle']}"
        )
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
