"""A whole job on vLLM replicas (the real CPU build) through every service, one step off policy: the producer
generates step k+1 on the replica while step k trains, and the weights reach vLLM between them."""

from __future__ import annotations

import json

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.trainer.model_builder import build_small_model
from tests._vllm import vllm_python

from .conftest import job_config, run_job


def test_a_one_step_off_job_on_vllm(tiny_task, tmp_path):
    python = vllm_python()
    model = build_small_model(tmp_path / "model", hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1)
    config = job_config(
        {**tiny_task, "model": str(model)},
        tmp_path / "runs",
        job={"name": "vllm", "steps": 3, "run_root": str(tmp_path / "runs")},
        rollout={"engine": "vllm", "service_overrides": [f"engine.vllm.python={python}"]},
        training={"mode": "one_step_off"},
    )
    record = run_job("grpo", config)
    assert record.state == spb.JOB_STATE_SUCCEEDED, record.error
    rows = [json.loads(line) for line in record.runner.run.metrics_file.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    assert rows[-1]["weights/version"] == 4 and rows[-1]["weights/stale_replicas"] == 0
