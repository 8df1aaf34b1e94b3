"""meshrl's side of the harness: `meshrl run` through all four services (Ray, embedded Redis, trainer, rollout
replica) on a job config written from the shared budget, with only model, data, reward, steps, batch and peak
learning rates given, everything else meshrl's defaults. Reads the run folder back into curves:
warmup.jsonl (held-out loss, and accuracy every `sft_eval_every` steps as on TRL's side), eval.jsonl
(held-out accuracy at step 0 = after the warm-up, every K steps, end) and metrics.jsonl (seconds per RL step, evaluation excluded). Called by bench/vs_trl/run.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench.vs_trl.budget import Budget, Curve
from bench.vs_trl.tasks import Task

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = Path(__file__).resolve().parent / "workflow.yaml"


def job_config(task: Task, b: Budget, model: Path, data: Path, run_root: Path, name: str, warmup: bool) -> dict:
    return {
        "job": {
            "name": name,
            "steps": b.rl_steps,
            "seed": b.seed,
            "run_root": str(run_root),
            "allowed_modules": ["meshrl", "bench.vs_trl"],
        },
        "model": {"path": str(model)},
        "data": {
            "train": str(data / "train.jsonl"),
            "eval": str(data / "eval.jsonl"),
            "prompt_key": "prompt",
            "answer_key": "answer",
            "response_key": "solution",
            "prompts_per_step": b.prompts_per_step,
        },
        "warmup": {
            "steps": b.sft_steps if warmup else 0,
            "batch_size": b.sft_batch,
            "lr": b.sft_lr,
            "eval_accuracy_every": b.sft_eval_every,
        },
        "rollout": {
            "n": b.n,
            "max_tokens": b.max_tokens,
            "temperature": b.temperature,
            "max_batch_size": max(64, b.rl_samples_per_step),
        },
        "algorithm": {"reward": task.reward, "loss": {"kl_coef": 0.0, "old_logprobs": "rollout"}},
        "trainer": {"optimizer": {"lr": b.rl_lr}},
        "eval": {"every": b.rl_eval_every, "max_prompts": b.n_eval},
        "checkpoint": {"every": 0},
    }


def _read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def run_meshrl(
    task: Task, b: Budget, model: Path, data: Path, out: Path, phase: str, warmup: bool, sets: list[str]
) -> tuple[Curve | None, Curve]:
    """One `meshrl run`: (warm-up curve or None, RL curve). `sets` are extra `--set key=value` overrides."""
    name = f"{task.name}-{phase}"
    run_root = out / "meshrl-runs"
    config = out / f"{name}.yaml"
    config.write_text(yaml.safe_dump(job_config(task, b, model, data, run_root, name, warmup), sort_keys=False))
    before = set(run_root.glob(f"{name}*")) if run_root.exists() else set()
    cmd = [
        sys.executable,
        "-m",
        "meshrl.scheduler.cli",
        "run",
        str(WORKFLOW),
        "--config",
        str(config),
        "--no-progress",
        *[a for s in sets for a in ("--set", s)],
    ]
    started = time.monotonic()
    log = out / f"{name}.log"
    with log.open("w") as f:
        subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=True)
    wall = time.monotonic() - started
    (run_dir,) = set(run_root.glob(f"{name}*")) - before
    evals = {r["step"]: (r["eval/accuracy"], r.get("eval/reward_mean")) for r in _read(run_dir / "eval.jsonl")}
    step_seconds = {r["step"]: r["time/step"] for r in _read(run_dir / "metrics.jsonl")}
    sft_points = _read(run_dir / "warmup.jsonl")
    sft = None
    if warmup:
        sft = Curve(
            "meshrl",
            "sft",
            extra={"heldout_loss": [(p["samples"], p["heldout_loss"]) for p in sft_points if "heldout_loss" in p]},
        )
        for p in sft_points:  # held-out accuracy every sft_eval_every steps, as TRL's side measures it
            if "heldout_accuracy" in p:
                sft.add(p["samples"], p["seconds"], p["heldout_accuracy"], p["heldout_reward"])
        sft.add(sft_points[-1]["samples"], sft_points[-1]["seconds"], *evals[0])
    rl = Curve(
        "meshrl",
        phase,
        extra={"process_seconds": wall, "run_dir": str(run_dir), "seconds_per_step": sorted(step_seconds.values())},
    )
    for step in sorted(evals):
        rl.add(step * b.rl_samples_per_step, sum(v for s, v in step_seconds.items() if s <= step), *evals[step])
    return sft, rl
