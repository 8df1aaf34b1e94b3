"""Trainer ranks as Ray actors across a two-node Ray cluster (`ray start --head` on 127.0.0.2, a worker on
127.0.0.3, CPU bundles, token auth): a TP=2 group and a DP=2 group with one rank on each node serve the same
log-probs as one process before and after an SGD step (within 1e-5), and `meshrl run` with `trainer.launch: group` places the
ranks where `meshrl plan` with the same inputs puts them, as its events record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from meshrl.common.batch_key import batch_key
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.scheduler.launch.launcher import ProcessLauncher, ServiceSpec
from meshrl.scheduler.planning.plan_cli import plan_main
from tests.integration.test_trainer_parallel import LOSS, MICRO, SGD, make_batch
from tests.integration.test_two_node_ray import HEAD, WORKER, _start_cluster, _stop

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
CPUS_PER_NODE = 4  # what `_start_cluster` gives each node


@pytest.fixture(scope="module")
def cluster():
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.urandom(16).hex()}
    temp_dir, head = _start_cluster(env)
    try:
        yield head, {k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR")}
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


def test_meshrl_run_places_the_ranks_where_meshrl_plan_puts_them(cluster, model, tmp_path):
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(16)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "job": {"name": "group", "steps": 1, "run_root": str(tmp_path / "runs")},
        "model": {"path": model},
        "data": {"train": str(tmp_path / "train.jsonl"), "prompts_per_step": 2},
        "rollout": {"replicas": 1, "n": 2, "max_tokens": 4},
        "eval": {"every": 0},
        "trainer": {
            "optimizer": {"lr": 1e-3},
            "tensor_parallel": 2,
            "launch": "group",
            "service_overrides": ["torch_threads=1"],
        },
        "services": {"use_ray": True, "ray_address": cluster[0]},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    command = [
        sys.executable,
        "-m",
        "meshrl.scheduler.cli",
        "run",
        "grpo",
        "--config",
        str(tmp_path / "job.yaml"),
        "--no-progress",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=480, env=_env(cluster), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    logs = [json.loads(line).get("log", "") for line in (run / "events.jsonl").read_text().splitlines()]
    recorded = json.loads(next(e for e in logs if e.startswith("trainer ranks: "))[len("trainer ranks: ") :])
    assert next(e for e in logs if e.startswith("plan: ")).startswith(
        f"plan: workflow 'grpo' on 2 node(s) x {CPUS_PER_NODE} CPU (n0={HEAD}, n1={WORKER})"
    )

    args = [
        "grpo",
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
    actor = next(m for m in plan["models"] if m["key"] == "actor")
    per_node = plan["cluster"]["workers_per_node"]
    planned = [(f"n{w // per_node}:{w % per_node}", (HEAD, WORKER)[w // per_node]) for w in actor["workers"][:2]]
    assert [(r["worker"], r["node"]) for r in recorded] == planned
    assert [r["rank"] for r in recorded] == [0, 1] and len({r["bundle"] for r in recorded}) == 2
    step = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert step["weights/version"] >= 1 and step["rollout/samples"] == 4
