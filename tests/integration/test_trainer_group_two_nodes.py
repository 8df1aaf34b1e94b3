"""Trainer ranks as Ray actors across a two-node Ray cluster (`ray start --head` on 127.0.0.2, a worker on
127.0.0.3, CPU bundles, token auth): a TP=2 group and a DP=2 group with one rank on each node serve the same
log-probs as one process before and after an SGD step (within 1e-5); `meshrl run` with `trainer.launch: group`
places the ranks where `meshrl plan` with the same inputs puts them, as its events record, and recovers without
a person from a killed rank and from the loss of the node its ranks run on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from meshrl.common.batch_key import batch_key
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.scheduler.launch.launcher import ProcessLauncher, ServiceSpec
from meshrl.scheduler.planning.plan_cli import plan_main
from tests.integration.test_trainer_parallel import LOSS, MICRO, SGD, make_batch
from tests.integration.test_two_node_ray import HEAD, WORKER, _pids_of, _start_cluster, _stop

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
CPUS_PER_NODE = 4  # what `_start_cluster` gives each node
STEPS, PROMPTS, N = 5, 2, 2
# The head declares a silent node dead after ~3 s instead of Ray's default ~30 s.
FAST_DEATH = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


@pytest.fixture(scope="module")
def cluster():
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.urandom(16).hex(), **FAST_DEATH}
    temp_dir, head = _start_cluster(env)
    try:
        yield head, {k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR")}, temp_dir
    finally:
        _stop(temp_dir, head)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from meshrl.trainer.model_builder import build_small_model

    root = tmp_path_factory.mktemp("twonode-model")
    return str(build_small_model(root / "model", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=3))


def _env(cluster) -> dict[str, str]:
    return {**os.environ, **cluster[1], "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("tp,dp", [(2, 1), (1, 2)], ids=["tp2", "dp2"])
def test_one_rank_per_node_matches_one_process(cluster, model, tmp_path, tp, dp):
    from meshrl.trainer.core import TrainerCore
    from meshrl.trainer.losses import LossConfig
    from meshrl.trainer.optim import OptimizerConfig

    launcher = ProcessLauncher(tmp_path / "logs", start_timeout=120)
    try:
        args = ["--host", HEAD, "--set", f"redis.embedded.data_dir={tmp_path / 'redis'}"]
        buffer_address = launcher.start([ServiceSpec("databuffer", "databuffer", args)])["databuffer"]
        batch = make_batch(275)
        with DataBufferClient(buffer_address) as buffer:
            buffer.put(batch_key("job", 0, "data"), batch)
        out = tmp_path / "group.json"
        command = [
            sys.executable,
            "-m",
            "tests.integration._group_driver",
            cluster[0],
            model,
            buffer_address,
            str(tmp_path),
            str(tp),
            str(dp),
            str(out),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=400, env=_env(cluster), cwd=ROOT)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        launcher.stop_all(grace=5)
    got = json.loads(out.read_text())
    assert [(p["rank"], p["node"]) for p in got["placements"]] == [(0, HEAD), (1, WORKER)]

    core = TrainerCore()  # the one-process reference: TP=1, the same weights, batch and step
    core.load_model("actor", model, optimizer=OptimizerConfig(**SGD))
    before = core.compute_logprobs("actor", batch, micro_batch_tokens=MICRO).values.values
    metrics = core.train_step("actor", batch, LossConfig(**LOSS), micro_batch_tokens=MICRO).metrics
    after = core.compute_logprobs("actor", batch, micro_batch_tokens=MICRO).values.values
    np.testing.assert_allclose(np.array(got["before"]), before, atol=1e-5, rtol=0)
    assert got["metrics"]["loss"] == pytest.approx(metrics["loss"], abs=1e-5)
    np.testing.assert_allclose(np.array(got["after"]), after, atol=1e-5, rtol=0)


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


def _kill(pids: list[int]) -> list[int]:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def _kill_node(temp_dir: Path, address: str) -> list[int]:
    """SIGKILLs what runs on the node at `address`, as if it lost power: its Ray processes (they name this
    cluster's temp dir and it) and everything they started (Ray's workers rename themselves, so they are found
    as the raylet's children; the trainer ranks as the workers')."""
    roots = [pid for pid in _pids_of(str(temp_dir)) if pid in _pids_of(address)]
    children, pids = _children(), []
    while roots:
        pids.append(roots.pop())
        roots.extend(children.get(pids[-1], []))
    return _kill(pids)


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


def _events(runs: Path) -> list[str]:
    files = list(runs.glob("*/events.jsonl"))
    lines = files[0].read_text().splitlines() if files else []
    return [json.loads(line).get("log", "") for line in lines if line.endswith("}")]


def _planned_ranks(tmp_path: Path, world: int, model: str = "actor") -> list[tuple[str, str]]:
    """(worker, node address) of ranks 0..world-1 of `model` (the actor's: the trainer's ranks; the rollout's
    first: replica 0) as `meshrl plan --json` prints them for the job's inputs."""
    args = [
        "dapo",
        "--config",
        str(tmp_path / "job.yaml"),
        "--nodes",
        "2",
        "--cpus-per-node",
        str(CPUS_PER_NODE),
        "--placement",
        "disaggregated",
        "--json",
    ]
    printed = tmp_path / "plan.json"
    with open(printed, "w") as stdout:
        assert plan_main(args, stdout=stdout) == 0
    plan = json.loads(printed.read_text())
    planned = next(m for m in plan["models"] if m["key"] == model)
    per_node = plan["cluster"]["workers_per_node"]
    return [(f"n{w // per_node}:{w % per_node}", (HEAD, WORKER)[w // per_node]) for w in planned["workers"][:world]]


@pytest.mark.timeout(900)  # two jobs and three trainer groups: 68-316 s measured on a loaded 2-core host
def test_a_run_places_ranks_by_the_plan_and_recovers_a_lost_rank_and_a_lost_node(cluster, model, tmp_path, capsys):
    """Last in this file: it takes the worker node down. `meshrl run` (DAPO, TP=2 group) places its ranks where
    `meshrl plan` puts them (the worker node, 127.0.0.3). After checkpoint 1, rank 1's process is SIGKILLed:
    rank 0's collective fails (gloo, INTERNAL), the group's client names the dead rank (Unavailable), the job
    restarts, a new group starts where the plan says and the job resumes from step 1. After checkpoint 3 the
    worker node dies (every process of it): the job restarts again, the new plan puts the group on the head, and
    the job resumes from step 3 and finishes. Every step trained once with all its samples, and the curves equal
    the same job's on one node without a failure."""
    runs = tmp_path / "runs"
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(16)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "job": {
            "name": "recover",
            "steps": STEPS,
            "run_root": str(runs),
            "max_restarts": 2,
            "restart_backoff_seconds": 0.5,
            "allowed_modules": ["meshrl", "tests.integration"],
        },
        "algorithm": {"reward": "tests.integration._digits_reward:digit_share"},  # a signal on a random model
        "model": {"path": model},
        "data": {"train": str(tmp_path / "train.jsonl"), "prompts_per_step": PROMPTS},
        "rollout": {"replicas": 1, "n": N, "max_tokens": 4},
        "eval": {"every": 0},
        "checkpoint": {"every": 1},
        "trainer": {
            "optimizer": {"lr": 3e-2},
            "tensor_parallel": 2,
            "launch": "group",
            "service_overrides": ["torch_threads=1"],
            "request_timeout_seconds": 120,
        },
        "services": {"use_ray": True, "ray_address": cluster[0], "start_timeout_seconds": 120},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
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
    job = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=_env(cluster), cwd=ROOT)
    rank_killed: list[int] = []
    node_killed: list[int] = []
    deadline = time.monotonic() + 480
    try:
        while job.poll() is None and time.monotonic() < deadline and not node_killed:
            if not rank_killed and list(runs.glob("*/checkpoints/step_000001/COMPLETE")):
                rank_killed = _kill(_rank_pids(runs, 1))
            groups = sum(e.startswith("trainer ranks: ") for e in _events(runs))
            if rank_killed and groups >= 2 and list(runs.glob("*/checkpoints/step_000003/COMPLETE")):
                node_killed = _kill_node(cluster[2], WORKER)
            time.sleep(0.05)
        job.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if job.poll() is None:
            job.kill()
        out.close()
    output = (tmp_path / "run.out").read_text()
    assert len(rank_killed) == 1 and node_killed, f"killed {rank_killed} then {node_killed}\n" + output[-3000:]
    assert job.returncode == 0, output[-4000:]

    logs = _events(runs)
    placed = [json.loads(e[len("trainer ranks: ") :]) for e in logs if e.startswith("trainer ranks: ")]
    plans = [e for e in logs if e.startswith("plan: ")]
    lost = [e for e in logs if e.startswith("trainer rank ")]
    restarts = [e for e in logs if e.startswith("restart ")]
    with capsys.disabled():
        print(
            f"\nrecovery: {len(node_killed)} processes of the node killed; losses {[e[:90] for e in lost]}; "
            f"restarts {[e[:60] for e in restarts]}"
        )
    assert plans[0].startswith(f"plan: workflow 'dapo' on 2 node(s) x {CPUS_PER_NODE} CPU (n0={HEAD}, n1={WORKER})")
    assert [(r["worker"], r["node"]) for r in placed[0]] == _planned_ranks(tmp_path, 2)  # the plan is what runs
    replicas = [json.loads(e[len("rollout replicas: ") :]) for e in logs if e.startswith("rollout replicas: ")]
    assert [(r["worker"], r["node"]) for r in replicas[0]] == _planned_ranks(tmp_path, 1, "rollout")  # the replica too
    assert [r["rank"] for r in placed[0]] == [0, 1] and len({r["bundle"] for r in placed[0]}) == 2
    assert {r["node"] for r in placed[0]} == {r["node"] for r in placed[1]} == {WORKER}
    # the watch reads the killed process's exit, or (once in 7 runs on a loaded host) Ray answers first that the
    # actor waiting on it is unavailable: either way the rank is named lost and the job restarts
    assert lost[0].startswith(
        ("trainer rank 1 on 127.0.0.3 exited with signal SIGKILL", "trainer rank 1 on 127.0.0.3 lost its Ray actor")
    ), lost
    assert plans[-1].startswith(f"plan: workflow 'dapo' on 1 node(s) x {CPUS_PER_NODE} CPU (n0={HEAD})")
    assert len(placed) == 3 and {r["node"] for r in placed[2]} == {HEAD}  # the new plan on the node left
    assert [r[: len("restart 1/2")] for r in restarts] == ["restart 1/2", "restart 2/2"]
    assert "resuming from step 1" in restarts[0] and "resuming from step 3" in restarts[1]
    (run,) = runs.iterdir()
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))  # every step once, none lost or repeated
    assert all(s["rollout/samples"] == PROMPTS * N for s in steps)
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["restarts"]) == (STEPS, 2)

    # The same job on one node (its ranks spawned by rank 0, no Ray, no restart) trains the same samples the same
    # way: the recovered run redid its lost steps exactly.
    cfg["job"]["run_root"] = str(tmp_path / "one-node")
    cfg["trainer"]["launch"], cfg["services"] = "local", {"use_ray": False}
    (tmp_path / "one-node.yaml").write_text(yaml.safe_dump(cfg))
    command[command.index(str(tmp_path / "job.yaml"))] = str(tmp_path / "one-node.yaml")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_env(cluster), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (one,) = (tmp_path / "one-node").iterdir()
    alone = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curves = {
        k: ([s[k] for s in steps], [s[k] for s in alone]) for k in ("reward/mean", "actor/grad_norm", "actor/entropy")
    }
    with capsys.disabled():
        print(f"recovered run vs one node, reward/mean: {curves['reward/mean']}")
    for key, (recovered, one_node) in curves.items():
        np.testing.assert_allclose(recovered, one_node, atol=1e-5, rtol=0, err_msg=key)
