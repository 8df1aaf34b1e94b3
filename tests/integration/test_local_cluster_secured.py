"""`meshrl up --token-file FILE`: a local set that requires the token on every service (a call without it is
refused UNAUTHENTICATED), whose services send it to each other, and on which a job publishes its weights over a
weight group whose members prove the token; the CLI reaches it with `--token-file`."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
from tests.integration.test_local_cluster import _kill_leftovers, meshrl


@pytest.mark.timeout(420)
def test_a_secured_local_set_refuses_strangers_and_runs_a_job_over_a_secured_weight_group(tmp_path):
    from meshrl.trainer.model_builder import build_small_model

    model = build_small_model(tmp_path / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    token = tmp_path / "token"
    token.write_text("local-secret\n")
    state = tmp_path / "state"
    up = meshrl(
        "up",
        "--model",
        str(model),
        "--replicas",
        "1",
        "--state-dir",
        str(state),
        "--token-file",
        str(token),
        timeout=300,
    )
    services = json.loads((state / "services.json").read_text()) if (state / "services.json").exists() else []
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "secured: every service requires the token" in up.stdout
        scheduler = next(s["address"] for s in services if s["name"] == "scheduler")
        with grpc.insecure_channel(scheduler) as channel:
            with pytest.raises(grpc.RpcError) as info:
                scheduler_pb2_grpc.SchedulerStub(channel).ListJobs(spb.ListJobsRequest(), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        job = tmp_path / "job.yaml"
        job.write_text(
            json.dumps(
                {
                    "job": {"name": "secured", "steps": 2},
                    "model": {"path": str(model)},
                    "data": {"train": str(tmp_path / "train.jsonl"), "prompts_per_step": 2},
                    "rollout": {"n": 2, "max_tokens": 4},
                    "eval": {"every": 0, "max_prompts": 2},
                    "weights": {"transport": "distributed"},
                }
            )
        )
        secured = ["--scheduler", scheduler, "--token-file", str(token)]
        started = time.monotonic()
        submit = meshrl(
            "submit",
            "grpo",
            "--config",
            str(job),
            "--config",
            str(state / "services.yaml"),
            "--job-id",
            "sec-1",
            *secured,
        )
        assert submit.returncode == 0, submit.stdout + submit.stderr
        watch = meshrl("watch", "sec-1", *secured, timeout=240)
        print(f"secured job (submit + watch): {time.monotonic() - started:.1f}s")
        assert watch.stdout.splitlines()[-1].startswith("job SUCCEEDED"), watch.stdout + watch.stderr
        assert "step 2: " in watch.stdout
    finally:
        if (state / "services.json").exists():
            meshrl("down", "--state-dir", str(state), timeout=120)
        _kill_leftovers([s["pid"] for s in services])
