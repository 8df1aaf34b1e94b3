"""`meshrl up` / `submit` / `status` / `watch` / `down` as a developer runs them: `up` starts independent
service processes that outlive the command, a GRPO job runs against services the scheduler did not
start, a service killed with SIGKILL is restarted on its address by `up`'s supervisor, and `down` leaves no
process behind (the embedded redis-server included)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshrl.api.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from meshrl.common.grpc_channel import open_channel

SERVICE_NAMES = ["databuffer", "trainer", "rollout-0", "rollout-1", "scheduler"]


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    """Running and not a zombie waiting to be reaped."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:  # gone meanwhile
        return ""


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(int(p.name)) == pid]


def _kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def meshrl(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The `meshrl` command of this environment, as a separate process."""
    cmd = [sys.executable, "-m", "meshrl.scheduler.cli", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return out


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict:
    from meshrl.trainer.model_builder import build_small_model

    root = tmp_path_factory.mktemp("local_cluster")
    model = build_small_model(root / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(16)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"root": root, "model": str(model), "train": str(root / "train.jsonl")}


@pytest.fixture
def cluster(task, tmp_path):
    """`meshrl up` with two replicas; yields its state dir, output and services; `down` (and a SIGKILL net) after."""
    state = tmp_path / "state"
    started = time.monotonic()
    out = meshrl("up", "--model", task["model"], "--replicas", "2", "--state-dir", str(state), timeout=300)
    print(f"meshrl up: {time.monotonic() - started:.1f}s")
    services = json.loads((state / "services.json").read_text()) if (state / "services.json").exists() else []
    redis_pid_file = state / "redis" / "redis.pid"
    redis_pid = int(redis_pid_file.read_text()) if redis_pid_file.exists() else None
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        yield {"state": state, "stdout": out.stdout, "services": services, "redis_pid": redis_pid}
    finally:
        if (state / "services.json").exists():
            meshrl("down", "--state-dir", str(state), timeout=120)
        supervisor = state / "supervisor.json"
        extra = [json.loads(supervisor.read_text())["pid"]] if supervisor.exists() else []
        _kill_leftovers([s["pid"] for s in services] + ([redis_pid] if redis_pid else []) + extra)


@pytest.mark.timeout(420)
def test_up_submit_watch_status_down(cluster, task, tmp_path):
    state, services = cluster["state"], cluster["services"]
    by_name = {s["name"]: s for s in services}
    assert sorted(by_name) == sorted(SERVICE_NAMES)

    # independent processes that outlived `meshrl up`: alive, and not children of this test
    for s in services:
        assert _alive(s["pid"]), f"{s['name']} (pid {s['pid']}) did not outlive `meshrl up`"
        assert _ppid(s["pid"]) != os.getpid()
        assert re.search(rf"^{s['name']}\s+{re.escape(s['address'])}\s+pid {s['pid']}$", cluster["stdout"], re.M)
    assert cluster["redis_pid"] is not None and _alive(cluster["redis_pid"]), "the embedded redis-server runs"
    match = re.search(r"export MESHRL_SCHEDULER=(\S+)", cluster["stdout"])
    assert match and match.group(1) == by_name["scheduler"]["address"]
    env = {"MESHRL_SCHEDULER": match.group(1)}

    # a second `up` on the same state dir refuses instead of starting a second set
    again = meshrl("up", "--model", task["model"], "--state-dir", str(state))
    assert again.returncode == 1 and "meshrl down" in again.stdout

    job = tmp_path / "job.yaml"
    job.write_text(
        json.dumps(
            {
                "job": {"name": "local", "steps": 1},  # the run goes under the scheduler's own run root
                "model": {"path": task["model"]},
                "data": {"train": task["train"], "prompts_per_step": 4},
                "rollout": {"n": 2, "max_tokens": 6},
                "eval": {"every": 0, "max_prompts": 4},
                "trainer": {"optimizer": {"lr": 1e-3}},
            }
        )
    )
    started = time.monotonic()
    submit = meshrl(
        "submit", "grpo", "--config", str(job), "--config", str(state / "services.yaml"), "--job-id", "local-1", env=env
    )
    assert submit.returncode == 0, submit.stdout + submit.stderr
    assert submit.stdout.startswith("local-1  ")

    watch = meshrl("watch", "local-1", env=env, timeout=240)
    print(f"job (submit + watch): {time.monotonic() - started:.1f}s")
    assert watch.returncode == 0, watch.stderr
    lines = watch.stdout.splitlines()
    assert lines[-1].startswith("job SUCCEEDED"), watch.stdout
    for node in ("data_load", "rollout", "reward", "advantage", "old_logprob", "ref_logprob", "actor_train"):
        assert f"step 1 node {node}: COMPLETED" in watch.stdout, f"no COMPLETED event of {node}:\n{watch.stdout}"
    (metrics_line,) = [line for line in lines if line.startswith("step 1: ")]
    metrics = dict(kv.split("=") for kv in metrics_line.removeprefix("step 1: ").split())
    assert float(metrics["rollout/samples"]) == 8 and float(metrics["weights/version"]) == 2
    assert float(metrics["weights/stale_replicas"]) == 0
    assert all(math.isfinite(float(v)) for v in metrics.values()), metrics_line

    status = meshrl("status", env=env)
    assert status.returncode == 0, status.stderr
    assert re.search(r"^local-1\s+SUCCEEDED\s+step 1/1\s+\S*runs/local-1$", status.stdout, re.M), status.stdout
    one = meshrl("status", "local-1", env=env)
    assert one.returncode == 0 and one.stdout.startswith("local-1  SUCCEEDED"), one.stdout + one.stderr

    # the job ran on the services `up` started: both replicas serve the published version, and the
    # scheduler launched nothing of its own (no child processes, no service logs in the run folder)
    for name in ("rollout-0", "rollout-1"):
        channel = open_channel(by_name[name]["address"])
        try:
            reply = rollout_pb2_grpc.RolloutStub(channel).GetStatus(rollout_pb2.GetStatusRequest(), timeout=30)
        finally:
            channel.close()
        assert reply.replica_id == name and reply.weight_version == 2
    assert _children(by_name["scheduler"]["pid"]) == []
    run_logs = state / "runs" / "local-1" / "logs"
    assert not [p.name for p in run_logs.glob("*.log") if p.stem in by_name], "the scheduler launched services"

    # supervised: a service killed with SIGKILL comes back on its own address, without a person
    trainer = by_name["trainer"]
    os.kill(trainer["pid"], signal.SIGKILL)
    record, deadline = {}, time.monotonic() + 180
    while time.monotonic() < deadline:
        record = {s["name"]: s for s in json.loads((state / "services.json").read_text())}
        if record["trainer"]["restarts"] == 1:
            break
        time.sleep(0.2)
    back = record["trainer"]
    assert back["restarts"] == 1 and back["address"] == trainer["address"] and back["pid"] != trainer["pid"], back
    channel = open_channel(back["address"])
    try:
        served = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    finally:
        channel.close()
    assert served.status == health_pb2.HealthCheckResponse.SERVING
    log = (state / "logs" / "supervisor.log").read_text()
    assert "trainer exited (code -9); restarting" in log and f"restarted trainer at {trainer['address']}" in log, log
    supervisor = json.loads((state / "supervisor.json").read_text())["pid"]

    started = time.monotonic()
    down = meshrl("down", "--state-dir", str(state))
    print(f"meshrl down: {time.monotonic() - started:.1f}s")
    assert down.returncode == 0 and down.stdout.startswith(f"stopped {len(services)} services"), down.stdout
    pids = [s["pid"] for s in services] + [cluster["redis_pid"], back["pid"], supervisor]
    deadline = time.monotonic() + 10  # processes reparented to init are reaped by it shortly after they exit
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {p for p in pids if _alive(p)}
    assert not left, f"processes left after `meshrl down`: {left}"
    assert not (state / "services.json").exists() and not (state / "services.yaml").exists()
    assert meshrl("down", "--state-dir", str(state)).stdout.startswith("nothing to stop")


def test_down_skips_a_pid_that_no_longer_runs_the_service(tmp_path):
    """A stale services.json (a crash, a reboot) must not make `down` signal whatever process now has that pid."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = tmp_path / "state"
        state.mkdir()
        entry = {"name": "trainer", "service": "trainer", "address": "127.0.0.1:1", "pid": bystander.pid}
        (state / "services.json").write_text(json.dumps([entry]))
        out = meshrl("down", "--state-dir", str(state))
        assert out.returncode == 0 and "trainer had already exited" in out.stdout, out.stdout + out.stderr
        assert bystander.poll() is None, "`meshrl down` killed a process that is not a meshrl service"
        assert not (state / "services.json").exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_up_that_cannot_start_a_service_says_why_and_leaves_nothing_running(tmp_path):
    state = tmp_path / "state"
    out = meshrl(
        "up", "--model", str(tmp_path / "no-such-model"), "--state-dir", str(state), "--timeout", "120", timeout=300
    )
    assert out.returncode == 2 and "the services did not start" in out.stderr, out.stdout + out.stderr
    assert "rollout exited" in out.stderr and "no-such-model" in out.stderr, out.stderr
    assert not (state / "services.json").exists() and not (state / "supervisor.json").exists()
    mine = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and str(state) in _cmdline(p)]
    assert not [p for p in mine if _alive(int(p))], f"processes left by a failed `meshrl up`: {mine}"
    bad = meshrl("up", "--model", "m", "--max-restarts", "-1", "--state-dir", str(state))
    assert bad.returncode == 2 and "--max-restarts and --replicas must be >= 0" in bad.stderr
