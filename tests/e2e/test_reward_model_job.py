"""A GRPO job whose reward node is a learned reward model (MODEL_INFERENCE / REWARD) runs through the real
services: the trainer loads the sequence classifier next to the actor, each step's reward is its score mixed
with the rule reward, and the actor trains on it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import yaml
from transformers import Qwen2Config, Qwen2ForSequenceClassification

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.workflow import builtin_workflow_text

from .conftest import job_config


def reward_model_like(model_dir: str, out) -> str:
    """A random one-label Qwen2 sequence classifier over the policy's vocabulary (its token ids)."""
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    torch.manual_seed(5)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=0,
    )
    model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.normal_(0.0, 1.0)
    model.save_pretrained(out)
    return str(out)


def test_a_reward_model_node_scores_each_step(tiny_task, tmp_path):
    rm = reward_model_like(tiny_task["model"], tmp_path / "rm")
    doc = yaml.safe_load(builtin_workflow_text("grpo"))
    reward = next(n for n in doc["nodes"] if n["node_id"] == "reward")
    reward.update(node_type="MODEL_INFERENCE", node_role="REWARD")
    reward["config"] = {"model_path": rm, "rule_weight": 1.0, "inputs": ["prompt_ids", "response_ids", "answer"]}
    jobs = JobManager()
    record = jobs.create(yaml.safe_dump(doc), job_config(tiny_task, tmp_path / "runs"), [])
    jobs.run(record)
    assert record.state == spb.JOB_STATE_SUCCEEDED, record.error
    steps = [json.loads(line) for line in record.runner.run.metrics_file.read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert math.isfinite(m["reward/model_score_mean"]) and m["reward/model_score_mean"] != 0.0
        # the reward is score + rule, so its mean is the two means' sum
        assert abs(m["reward/mean"] - m["reward/model_score_mean"] - m["reward/rule_mean"]) < 1e-5
        assert abs(m["reward/score_mean"] - m["reward/model_score_mean"]) < 1e-5  # the trainer's reply
        assert math.isfinite(m["actor/loss"])
    assert [m["weights/version"] for m in steps] == [2, 3]
