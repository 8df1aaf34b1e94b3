"""The asynchronous modes' step size follows the samples' staleness by default (lag_lr_scale =
ASYNC_LAG_LR_SCALE), sync leaves it unset, a job's own value (0 included) stays, and the train node then reads
the tokens' versions; the setting reaches the trainer's message."""

from __future__ import annotations

from meshrl.common import batch_schema as S
from meshrl.common.config import load_config
from meshrl.scheduler.clients import loss_proto
from meshrl.scheduler.config import ASYNC_LAG_LR_SCALE, JobConfig
from meshrl.scheduler.step.old_logprobs import ratio_reads


def loss_of(*overrides: str):
    cfg = load_config(JobConfig, env={}, overrides=["model.path=m", "data.train=t.jsonl", *overrides])
    return cfg.algorithm.loss


def test_asynchronous_modes_scale_the_step_by_staleness_unless_the_job_says_otherwise():
    assert loss_of().lag_lr_scale is None  # sync: nothing is stale
    for mode in (["training.mode=one_step_off"], ["training.mode=async", "training.max_staleness=2"]):
        loss = loss_of(*mode)
        assert loss.lag_lr_scale == ASYNC_LAG_LR_SCALE == 1.0
        assert loss_proto(loss.model_dump()).lag_lr_scale == ASYNC_LAG_LR_SCALE  # what the trainer receives
        assert S.RESPONSE_VERSIONS in ratio_reads(loss.model_dump())
        assert loss_of(*mode, "algorithm.loss.lag_lr_scale=0").lag_lr_scale == 0
        assert loss_of(*mode, "algorithm.loss.lag_lr_scale=0.5").lag_lr_scale == 0.5
    assert ratio_reads({"lag_lr_scale": 1.0}) == [S.RESPONSE_VERSIONS]
    assert ratio_reads({"lag_lr_scale": 0.0}) == []
