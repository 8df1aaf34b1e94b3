"""A job through one kill of each of its services, against the same job undisturbed (issue 18).

Runs the default example (examples/countdown: its model, data, warm-up and recipe; same seed) twice through
the real services, one run after the other, each under its own scheduler process (`--driver`, a
`JobManager` running the job): once undisturbed, once with a kill -9 of each service at a different step:
the trainer mid-step, the rollout replica mid-generation, Redis (the data buffer's embedded redis-server),
the data buffer itself, and the scheduler (a new scheduler process picks the run up from its folder). No
person acts: the job restarts its services and resumes from its last checkpoint by itself.

Prints the fault table (fault, injected, survived without a person, steps lost, samples lost) and both
runs' held-out accuracy side by side, with the binomial noise of their difference (2 sigma over the
held-out prompts). Steps lost are steps redone after a restart (bounded by checkpoint.every); samples lost
are samples missing from the completed steps' records.

Run: `nice -n 10 .venv/bin/python bench/faults/run.py [--steps 60] [--checkpoint-every 5] [--use-ray]`
from the repository root (the example's model and data are built under runs/ on first use).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "countdown"
sys.path.insert(0, str(ROOT / "tests" / "faults"))  # finding a job's service processes by command line
from _inject import child_pids, service_pids  # noqa: E402

RESTART = re.compile(r"restart \d+/\d+: \w+ at step (\d+):.*resuming from step (\d+)", re.S)
RESUMED = re.compile(r"resumed from .* at step (\d+)")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="RL steps (the example's 60)")
    p.add_argument("--checkpoint-every", type=int, default=5, help="checkpoint.every of both runs")
    p.add_argument("--eval-every", type=int, default=10, help="held-out evaluation every K steps")
    p.add_argument("--request-timeout", type=float, default=60.0, help="per-call deadline to trainer/replicas")
    p.add_argument("--use-ray", action="store_true", help="services as Ray actors (default: plain processes)")
    p.add_argument("--run-root", default="", help="keep both run folders here (default: a temporary folder)")
    p.add_argument("--out", default="", help="write the figures as JSON here too")
    p.add_argument("--driver", nargs=3, metavar=("RUN_ROOT", "CONFIG", "JOB_ID"), help=argparse.SUPPRESS)
    p.add_argument("--recover", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def job_yaml(a: argparse.Namespace, run_root: Path) -> str:
    """The example's config, the same for both runs but for the job id."""
    cfg = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    cfg["job"].update(steps=a.steps, max_restarts=8, restart_backoff_seconds=1.0)
    for section, field in (("model", "path"), ("data", "train"), ("data", "eval")):
        cfg[section][field] = str(ROOT / cfg[section][field])  # shared by both runs: built once
    cfg["eval"]["every"] = a.eval_every
    cfg["checkpoint"] = {"every": a.checkpoint_every}
    cfg["services"] = {**cfg.get("services", {}), "use_ray": a.use_ray}
    # a call to a dead service is retried until its deadline: these bound the time to notice a death
    cfg["rollout"]["request_timeout_seconds"] = a.request_timeout
    cfg["trainer"]["request_timeout_seconds"] = a.request_timeout
    return yaml.safe_dump(cfg)


def driver(run_root: str, config: str, job_id: str, recover: bool) -> int:
    """The scheduler's process: runs the job (or, `recover`, picks up the run left in its run root)."""
    sys.path.insert(0, str(ROOT))  # the example's modules (data generator, reward)
    from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
    from meshrl.scheduler.jobs import JobManager

    jobs = JobManager(run_root=run_root)
    if recover:
        (record,) = jobs.recover()
        record.thread.join()
    else:
        record = jobs.create((EXAMPLE / "workflow.yaml").read_text(), Path(config).read_text(), [], job_id=job_id)
        jobs.run(record)
    return 0 if record.state == spb.JOB_STATE_SUCCEEDED else 1


@dataclass
class Fault:
    name: str
    node: str  # inject when this node of `step` starts running
    step: int
    inject: Callable[[Path, subprocess.Popen], int]
    injected: int = 0
    steps_lost: int = 0


def _kill(pids: list[int]) -> int:
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return len(pids)


def faults(steps: int) -> list[Fault]:
    """One kill of each service, spread over the run (between checkpoints, so that steps are redone)."""
    at = [max(k + 1, round(steps * share)) for k, share in enumerate((0.15, 0.32, 0.48, 0.65, 0.82))]
    return [
        Fault("trainer kill -9 mid-step", "actor_train", at[0], lambda run, _: _kill(service_pids(run, "trainer"))),
        Fault("replica kill -9 mid-generation", "rollout", at[1], lambda run, _: _kill(service_pids(run, "rollout"))),
        Fault(
            "redis kill -9 mid-step",
            "reward",
            at[2],
            lambda run, _: _kill([c for p in service_pids(run, "databuffer") for c in child_pids(p, "redis-server")]),
        ),
        Fault(
            "data buffer kill -9 mid-step", "advantage", at[3], lambda run, _: _kill(service_pids(run, "databuffer"))
        ),
        Fault("scheduler kill -9 mid-step", "actor_train", at[4], lambda run, proc: _kill([proc.pid])),
    ]


def _scheduler(a: argparse.Namespace, root: Path, config: Path, job_id: str, recover: bool) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--driver", str(root), str(config), job_id] + (["--recover"] if recover else [])
    return subprocess.Popen(cmd, cwd=ROOT)


def run_job(a: argparse.Namespace, root: Path, job_id: str, plan: list[Fault]) -> dict:
    """Runs one job under a scheduler process, injecting `plan` as its nodes start; returns its figures."""
    config = root / f"{job_id}.yaml"
    config.write_text(job_yaml(a, root))
    run = root / job_id
    proc = _scheduler(a, root, config, job_id, recover=False)
    pending, current, offset, started = list(plan), None, 0, time.monotonic()
    while True:
        ended = proc.poll() is not None
        lines, offset = _new_lines(run / "events.jsonl", offset)
        for event in lines:
            node, text = event.get("node"), event.get("log", "")
            if text and current is not None and (m := RESTART.search(text)):
                current.steps_lost += max(int(m.group(1)) - int(m.group(2)), 0)
            if text and current is not None and current.name.startswith("scheduler") and (m := RESUMED.search(text)):
                current.steps_lost += max(current.step - int(m.group(1)), 0)
            if node and pending and node.get("state") == "NODE_STATE_RUNNING":
                f = pending[0]
                if (node.get("nodeId"), int(node.get("step", 0))) == (f.node, f.step):
                    f.injected, current = f.inject(run, proc), pending.pop(0)
                    print(f"  {time.monotonic() - started:6.0f} s  injected: {f.name} at step {f.step}", flush=True)
        if ended:
            if current is not None and current.name.startswith("scheduler") and proc.returncode == -signal.SIGKILL:
                time.sleep(2.0)  # its services notice their parent is gone and stop
                proc = _scheduler(a, root, config, job_id, recover=True)
                continue
            break
        time.sleep(0.5)
    return _figures(a, run, proc.returncode, time.monotonic() - started)


def _new_lines(path: Path, offset: int) -> tuple[list[dict], int]:
    if not path.exists():
        return [], offset
    with open(path) as f:
        f.seek(offset)
        text = f.read()
    complete = text[: text.rfind("\n") + 1]
    events = []
    for line in complete.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by the scheduler's kill
    return events, offset + len(complete.encode())


def _figures(a: argparse.Namespace, run: Path, code: int, seconds: float) -> dict:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    per_step = cfg["data"]["prompts_per_step"] * cfg["rollout"]["n"]
    samples: dict[int, int] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        samples[row["step"]] = int(row.get("rollout/samples", 0))
    lost = {s: per_step - samples.get(s, 0) for s in range(1, a.steps + 1)}
    by_step = {}  # a restart before the first checkpoint evaluates step 0 again: the last record counts
    for line in (run / "eval.jsonl").read_text().splitlines():
        if line.strip():
            by_step[json.loads(line)["step"]] = json.loads(line)
    evals = [by_step[s] for s in sorted(by_step)]
    return {
        "succeeded": code == 0,
        "seconds": seconds,
        "lost": lost,
        "evals": evals,
        "final": evals[-1]["eval/accuracy"],
        "prompts": int(evals[-1]["eval/prompts"]),
    }


def print_report(a: argparse.Namespace, calm: dict, hit: dict, plan: list[Fault]) -> None:
    print(f"\n{a.steps} RL steps, checkpoint.every={a.checkpoint_every}, same config and seed for both runs\n")
    print(f"{'fault':<34}{'injected':>9}{'survived':>10}{'steps lost':>12}{'samples lost':>14}")
    for i, f in enumerate(plan):
        upto = plan[i + 1].step if i + 1 < len(plan) else a.steps + 1
        lost = sum(v for s, v in hit["lost"].items() if f.step <= s < upto)
        survived = hit["succeeded"] and f.injected > 0
        print(f"{f.name:<34}{f.injected:>9}{survived!s:>10}{f.steps_lost:>12}{lost:>14}")
    p, q, n = calm["final"], hit["final"], calm["prompts"]
    sigma = math.sqrt(p * (1 - p) / n + q * (1 - q) / n)
    print(f"\n{'run':<14}{'ended':>10}{'wall s':>9}{'final held-out acc':>20}   accuracy by step")
    for name, r in (("undisturbed", calm), ("faults", hit)):
        curve = " ".join(f"{e['step']}:{e['eval/accuracy']:.3f}" for e in r["evals"])
        ended = "succeeded" if r["succeeded"] else "FAILED"
        print(f"{name:<14}{ended:>10}{r['seconds']:>9.0f}{r['final']:>20.3f}   {curve}")
    verdict = "within" if abs(q - p) <= 2 * sigma else "OUTSIDE"
    print(
        f"\ndifference {q - p:+.3f}; 2 sigma (binomial, {n} held-out prompts each) = {2 * sigma:.3f}: {verdict} noise"
    )


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.driver:
        return driver(*a.driver, a.recover)
    plan = faults(a.steps)
    with tempfile.TemporaryDirectory(prefix="mr-faults-") as tmp:
        root = Path(a.run_root or tmp).resolve()
        root.mkdir(parents=True, exist_ok=True)
        print(f"undisturbed run in {root / 'calm'} ...", flush=True)
        calm = run_job(a, root, "calm", [])
        print(f"fault run in {root / 'faults'} ...", flush=True)
        hit = run_job(a, root, "faults", plan)
    print_report(a, calm, hit, plan)
    if a.out:
        figures = {"undisturbed": calm, "faults": hit, "table": [f.__dict__ | {"inject": None} for f in plan]}
        Path(a.out).write_text(json.dumps(figures, indent=1, default=str))
    return 0 if calm["succeeded"] and hit["succeeded"] and all(f.injected for f in plan) else 1


if __name__ == "__main__":
    sys.exit(main())
