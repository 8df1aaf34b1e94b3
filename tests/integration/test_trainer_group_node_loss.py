"""Recovery without a person: `meshrl run` with its trainer ranks as Ray actors (`trainer.launch: group`, TP=2)
on a two-node Ray cluster (127.0.0.2 head, 127.0.0.3 worker) where the plan puts the ranks on the worker node.
After the first checkpoint the worker node dies (every Ray process of it killed by pid; the ranks end with their
actors). The step fails at once, the job restarts its services, the new plan puts the group on the remaining
node, the job resumes from the checkpoint and finishes: every step trained once with all its samples, the
restart in the events and the job's summary."""

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

from tests.integration.test_two_node_ray import HEAD, WORKER, _pids_of, _start_cluster, _stop

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, N = 4, 2, 2
# The head declares a silent node dead after ~3 s instead of Ray's default ~30 s.
FAST_DEATH = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


@pytest.fixture
def cluster():
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.urandom(16).hex(), **FAST_DEATH}
    temp_dir, head = _start_cluster(env)
    try:
        yield head, temp_dir, {k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR")}
    finally:
        _stop(temp_dir, head)


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(proc.name))
    return out


def _kill_node(temp_dir: Path, address: str) -> list[int]:
    """SIGKILLs what runs on the node at `address`, as if it lost power: its Ray processes (they name this
    cluster's temp dir and it) and everything they started (Ray's workers rename themselves, so they are found
    as the raylet's children; the trainer ranks as the workers')."""
    roots = [pid for pid in _pids_of(str(temp_dir)) if pid in _pids_of(address)]
    children, pids = _children(), []
    while roots:
        pid = roots.pop()
        pids.append(pid)
        roots.extend(children.get(pid, []))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def test_a_lost_node_is_recovered_from_the_last_checkpoint(cluster, tmp_path, capsys):
    from meshrl.trainer.model_builder import build_small_model

    head, temp_dir, ray_env = cluster
    model = build_small_model(tmp_path / "model", hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, seed=0)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(16)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "job": {
            "name": "nodeloss",
            "steps": STEPS,
            "run_root": str(tmp_path / "runs"),
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
        "services": {"use_ray": True, "ray_address": head, "start_timeout_seconds": 120},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, **ray_env, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
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
            if list((tmp_path / "runs").glob("*/checkpoints/step_000001/COMPLETE")):
                killed = _kill_node(temp_dir, WORKER)
            time.sleep(0.2)
        job.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if job.poll() is None:
            job.kill()
        out.close()
    output = (tmp_path / "run.out").read_text()
    assert killed, "the job ended before its first checkpoint: nothing was killed\n" + output[-3000:]
    assert job.returncode == 0, output[-4000:]

    (run,) = (tmp_path / "runs").iterdir()
    logs = [json.loads(line).get("log", "") for line in (run / "events.jsonl").read_text().splitlines()]
    placed = [json.loads(e[len("trainer ranks: ") :]) for e in logs if e.startswith("trainer ranks: ")]
    restarts = [e for e in logs if e.startswith("restart ")]
    lost = [e for e in logs if e.startswith("trainer rank ")]
    with capsys.disabled():
        print(f"\nnode loss: {len(killed)} processes killed; {restarts}; first loss report: {lost[:1]}")
    assert {r["node"] for r in placed[0]} == {WORKER}  # the plan put the ranks on the node that died
    assert {r["node"] for r in placed[-1]} == {HEAD}  # ... and the new plan on the one left
    assert len(restarts) == 1 and restarts[0].startswith("restart 1/2:") and "resuming from step" in restarts[0]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))  # every step once, none lost or repeated
    assert all(s["rollout/samples"] == PROMPTS * N for s in steps)
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["restarts"], summary["steps_lost"]) == (STEPS, 1, 1)
