"""A trainer group's rank killed under a running job (`meshrl run`, local Ray, `trainer.launch: group`, TP=2):
rank 1's process is SIGKILLed after the first checkpoint. The loss is reported at once, the step fails instead
of waiting in a collective, the job tears the group down, creates a new one and resumes from the checkpoint, and
finishes with every step trained once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, N = 4, 2, 2


def _rank_pids(run_root: Path, rank: int) -> list[int]:
    """The trainer processes of this test's runs (their roots name the run folder) started as `rank`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"meshrl.trainer" in cmdline and str(run_root).encode() in cmdline and f"RANK={rank}".encode() in environ:
            pids.append(int(proc.name))
    return pids


def test_a_killed_rank_fails_the_step_and_the_group_is_recreated(tmp_path, capsys):
    from meshrl.trainer.model_builder import build_small_model

    model = build_small_model(tmp_path / "model", hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, seed=0)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(16)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = tmp_path / "runs"
    cfg = {
        "job": {
            "name": "rankloss",
            "steps": STEPS,
            "run_root": str(runs),
            "max_restarts": 2,
            "restart_backoff_seconds": 0.5,
        },
        "model": {"path": str(model)},
        "data": {"train": str(tmp_path / "train.jsonl"), "prompts_per_step": PROMPTS},
        "rollout": {"replicas": 1, "n": N, "max_tokens": 4},
        "eval": {"every": 0},
        "checkpoint": {"every": 1},
        "trainer": {
            "optimizer": {"lr": 1e-3},
            "tensor_parallel": 2,
            "launch": "group",
            "service_overrides": ["torch_threads=1"],
            "request_timeout_seconds": 120,
        },
        "services": {"use_ray": True, "start_timeout_seconds": 120},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [
        sys.executable,
        "-m",
        "meshrl.scheduler.cli",
        "run",
        "dapo",
        "--config",
        str(tmp_path / "job.yaml"),
        "--no-progress",
    ]
    out = open(tmp_path / "run.out", "w")  # noqa: SIM115 - the job's output, read after it ends
    job = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    killed: list[int] = []
    deadline = time.monotonic() + 420
    try:
        while job.poll() is None and time.monotonic() < deadline and not killed:
            if list(runs.glob("*/checkpoints/step_000001/COMPLETE")):
                killed = _rank_pids(runs, 1)
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        job.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if job.poll() is None:
            job.kill()
        out.close()
    output = (tmp_path / "run.out").read_text()
    assert len(killed) == 1, f"rank 1 was not found once: {killed}\n" + output[-3000:]
    assert job.returncode == 0, output[-4000:]

    (run,) = runs.iterdir()
    logs = [json.loads(line).get("log", "") for line in (run / "events.jsonl").read_text().splitlines()]
    lost = [e for e in logs if e.startswith("trainer rank ")]
    restarts = [e for e in logs if e.startswith("restart ")]
    with capsys.disabled():
        print(f"\nrank loss: {lost[:1]}; {[r[:200] for r in restarts]}")
    assert lost and lost[0].startswith("trainer rank 1 ") and "signal SIGKILL" in lost[0]
    assert len(restarts) == 1 and "resuming from step" in restarts[0]
    assert sum(e.startswith("trainer ranks: ") for e in logs) == 2  # the group, then the one that replaced it
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all(s["rollout/samples"] == PROMPTS * N for s in steps)
