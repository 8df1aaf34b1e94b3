"""The step size scaled by staleness (lag_lr_scale) is off unless a job sets it, in every mode (it helped in one
process and cost one_step_off accuracy through the services: bench/async/README.md); a job's value reaches the
trainer's message, and the train node then reads the tokens' versions."""

from __future__ import annotations

from meshrl.common import batch_schema as S
from meshrl.common.config import load_config
from meshrl.scheduler.clients import loss_proto
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.step.scoring.old_logprobs import ratio_reads


def loss_of(*overrides: str):
    cfg = load_config(JobConfig, env={}, overrides=["model.path=m", "data.train=t.jsonl", *overrides])
    return cfg.algorithm.loss


def test_the_step_size_follows_staleness_only_when_the_job_says_so():
    for mode in ([], ["training.mode=one_step_off"], ["training.mode=async", "training.max_staleness=2"]):
        assert loss_of(*mode).lag_lr_scale is None
        loss = loss_of(*mode, "algorithm.loss.lag_lr_scale=0.5")
        assert loss.lag_lr_scale == 0.5 and loss_proto(loss.model_dump()).lag_lr_scale == 0.5
        assert S.RESPONSE_VERSIONS in ratio_reads(loss.model_dump())
    assert ratio_reads({"lag_lr_scale": 1.0}) == [S.RESPONSE_VERSIONS]
    assert ratio_reads({"lag_lr_scale": 0.0}) == []
