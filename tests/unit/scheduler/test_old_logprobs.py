"""algorithm.loss.old_logprobs as the step sees it: the columns the actor's train node reads for its ratio,
and the refusal, when the job is created, of a workflow that computes old log-probs the loss would ignore."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrl.common import batch_schema as S
from meshrl.common.config import load_config
from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.step.old_logprobs import check_old_logprobs, ratio_reads
from meshrl.scheduler.workflow import load_workflow_text

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "countdown" / "workflow.yaml"
RECOMPUTING = """
dag_id: recomputing
nodes:
  - {node_id: data_load, node_type: DATA_LOAD, node_role: DATA}
  - {node_id: rollout, node_type: ROLLOUT, node_role: ROLLOUT, dependencies: [data_load]}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [rollout]}
  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward]}
  - {node_id: old_logprob, node_type: MODEL_INFERENCE, node_role: ACTOR, dependencies: [rollout]}
  - node_id: actor_train
    node_type: MODEL_TRAIN
    node_role: ACTOR
    dependencies: [advantage, old_logprob]
    config: {inputs: [prompt_ids, response_ids, advantages, old_logprobs]}
"""


def job(*overrides: str) -> JobConfig:
    return load_config(JobConfig, env={}, overrides=["model.path=m", "data.train=t.jsonl", *overrides])


def test_the_train_node_reads_rollout_logprobs_only_when_the_loss_uses_them():
    assert ratio_reads({}) == [] and ratio_reads({"old_logprobs": "recompute", "tis_cap": 0}) == []
    assert ratio_reads({"old_logprobs": "rollout"}) == [S.ROLLOUT_LOGPROBS]
    assert ratio_reads({"tis_cap": 2.0}) == ratio_reads({"mis_cap": 5.0}) == [S.ROLLOUT_LOGPROBS]


def test_old_logprobs_the_loss_would_ignore_are_refused_at_creation():
    workflow = load_workflow_text(RECOMPUTING, {})
    check_old_logprobs(job(), workflow.nodes)  # recompute (the default) reads them
    with pytest.raises(InvalidArgument, match="'actor_train' declares 'old_logprobs'.*drop old_logprobs"):
        check_old_logprobs(job("algorithm.loss.old_logprobs=rollout"), workflow.nodes)


def test_the_default_example_takes_pi_old_from_the_rollout():
    workflow = load_workflow_text(EXAMPLE.read_text(), {})
    cfg = job("algorithm.loss.old_logprobs=rollout")
    check_old_logprobs(cfg, workflow.nodes)
    assert not any(n.node_id == "old_logprob" for n in workflow.nodes)
