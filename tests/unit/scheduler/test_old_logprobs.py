"""algorithm.loss.old_logprobs as the step sees it: the choice for a job that leaves it unset, the columns the
actor's train node reads for its ratio, and the refusals, when the job is created, of a workflow that computes
old log-probs the loss would ignore or lacks those a 'recompute' loss needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrl.common import batch_schema as S
from meshrl.common.config import load_config
from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.step.scoring.old_logprobs import ratio_reads, resolve_old_logprobs
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
    # no pass: pi_old from the rollout's log-probs and each token's version
    assert ratio_reads({"old_logprobs": "interpolated"}) == [S.ROLLOUT_LOGPROBS, S.RESPONSE_VERSIONS]


def test_old_logprobs_the_loss_would_ignore_are_refused_at_creation():
    workflow = load_workflow_text(RECOMPUTING, {})
    resolve_old_logprobs(job("algorithm.loss.old_logprobs=recompute"), workflow.nodes)  # it reads them
    for source in ("rollout", "in-train", "interpolated"):
        with pytest.raises(InvalidArgument, match="'actor_train' declares 'old_logprobs'.*drop old_logprobs"):
            resolve_old_logprobs(job(f"algorithm.loss.old_logprobs={source}"), workflow.nodes)


def test_recompute_without_an_old_logprob_node_is_refused_at_creation():
    workflow = load_workflow_text(EXAMPLE.read_text(), {})
    with pytest.raises(InvalidArgument, match="no actor MODEL_TRAIN node declares it.*old_logprobs: in-train"):
        resolve_old_logprobs(job("algorithm.loss.old_logprobs=recompute"), workflow.nodes)


@pytest.mark.parametrize(
    ("overrides", "chosen"),
    [
        ((), "rollout"),  # on-policy samples: the engine's log-probs are pi_old
        (("algorithm.loss.tis_cap=2",), "in-train"),  # a cap needs pi_old apart from the behaviour policy
        (("training.mode=one_step_off",), "in-train"),
        (("training.mode=async", "training.max_staleness=2"), "in-train"),
    ],
)
def test_unset_old_logprobs_fits_the_mode_without_an_old_logprob_node(overrides, chosen):
    cfg = job(*overrides)
    resolve_old_logprobs(cfg, load_workflow_text(EXAMPLE.read_text(), {}).nodes)
    assert cfg.algorithm.loss.old_logprobs == chosen
    if chosen == "in-train" and not overrides[0].startswith("algorithm"):  # the async modes' correction applies
        assert cfg.algorithm.loss.tis_cap and cfg.algorithm.loss.mis_cap


def test_unset_old_logprobs_recomputes_when_the_workflow_has_the_node():
    for mode in ("sync", "one_step_off"):
        cfg = job(f"training.mode={mode}")
        resolve_old_logprobs(cfg, load_workflow_text(RECOMPUTING, {}).nodes)
        assert cfg.algorithm.loss.old_logprobs == "recompute"


def test_an_explicit_choice_is_kept():
    cfg = job("training.mode=one_step_off", "algorithm.loss.old_logprobs=rollout")
    resolve_old_logprobs(cfg, load_workflow_text(EXAMPLE.read_text(), {}).nodes)
    assert cfg.algorithm.loss.old_logprobs == "rollout" and not cfg.algorithm.loss.tis_cap


def test_the_default_example_has_no_old_logprob_node():
    workflow = load_workflow_text(EXAMPLE.read_text(), {})
    assert not any(n.node_id == "old_logprob" for n in workflow.nodes)
