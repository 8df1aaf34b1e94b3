"""A MODEL_INFERENCE node of role REWARD: a job accepts it with a reward-model folder, refuses it (naming the
node, the field and the fix, writing nothing) when the folder or its settings are wrong, and mixes the model's
score with the rule reward as configured."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.step.dag.dispatch import check_runnable, handler_name
from meshrl.scheduler.step.scoring.reward_model import RewardModelConfig, combine, reward_model_path
from meshrl.scheduler.workflow import WorkflowError, builtin_workflow_text, load_workflow_text

CONFIG = {"model": {"path": "unused"}, "data": {"train": "unused.jsonl"}}


def rm_folder(path) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForSequenceClassification"]}))
    return str(path)


def grpo_with_reward_model(**config) -> str:
    """The built-in GRPO workflow whose reward node is a reward model with `config`."""
    doc = yaml.safe_load(builtin_workflow_text("grpo"))
    doc.pop("x-policy-forward", None)
    reward = next(n for n in doc["nodes"] if n["node_id"] == "reward")
    reward.update(node_type="MODEL_INFERENCE", node_role="REWARD")
    reward["config"] = {"inputs": ["prompt_ids", "response_ids", "answer"], **config}
    return yaml.safe_dump(doc)


def test_a_reward_model_node_runs_and_writes_the_reward_column(tmp_path):
    path = rm_folder(tmp_path / "rm")
    wf = load_workflow_text(grpo_with_reward_model(model_path=path, rule_weight=0.5), CONFIG)
    check_runnable(wf)
    node = next(n for n in wf.nodes if n.node_id == "reward")
    assert handler_name(node) == "reward_model"
    assert reward_model_path(wf.nodes) == str((tmp_path / "rm").resolve())


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, "config.model_path: Field required"),
        ({"model_path": "{rm}", "rule_weight": "much"}, "config.rule_weight"),
        ({"model_path": "{rm}", "score_weight": float("nan")}, "must be a finite number"),
        ({"model_path": "{missing}"}, "has no config.json"),
        ({"model_path": "{rm}", "temperature": 0.5}, "config.temperature is read by nothing"),
    ],
    ids=["no-model", "weight-not-a-number", "weight-nan", "folder-without-config", "unknown-key"],
)
def test_a_job_refuses_a_reward_model_node_it_cannot_run(tmp_path, config, expected):
    rm = rm_folder(tmp_path / "rm")
    config = {k: v.format(rm=rm, missing=tmp_path / "missing") if isinstance(v, str) else v for k, v in config.items()}
    text = grpo_with_reward_model(**config)
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(WorkflowError, match=expected) as err:
        JobManager(str(runs), 1).create(text, yaml.safe_dump(CONFIG), [])
    assert "node 'reward'" in str(err.value)
    assert not list(runs.iterdir())  # nothing was written for the refused job


def test_two_reward_model_nodes_must_name_one_model(tmp_path):
    doc = yaml.safe_load(grpo_with_reward_model(model_path=rm_folder(tmp_path / "a")))
    second = json.loads(json.dumps(next(n for n in doc["nodes"] if n["node_id"] == "reward")))
    second.update(node_id="reward_b", config={"model_path": rm_folder(tmp_path / "b"), "inputs": ["prompt_ids"]})
    doc["nodes"].append(second)
    with pytest.raises(WorkflowError, match="the trainer holds one reward model"):
        check_runnable(load_workflow_text(yaml.safe_dump(doc), CONFIG))


def test_the_reward_is_the_weighted_sum_of_score_and_rule():
    scores = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    rule = np.array([1.0, 0.0, 1.0], dtype=np.float32)
    rewards, accuracy = combine(scores, rule, RewardModelConfig(model_path="m", score_weight=2.0, rule_weight=0.5))
    np.testing.assert_allclose(rewards, [1.5, -2.0, 4.5])
    np.testing.assert_array_equal(accuracy, [1.0, 0.0, 1.0])  # from the rule, not the mixed reward
    rewards, accuracy = combine(scores, None, RewardModelConfig(model_path="m"))
    np.testing.assert_allclose(rewards, scores)
    np.testing.assert_array_equal(accuracy, [0.0, 0.0, 1.0])
