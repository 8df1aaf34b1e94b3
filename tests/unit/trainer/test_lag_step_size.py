"""lag_lr_scale (step size scaled by staleness): each optimizer step's learning rate is divided by
1 + c * the mean version lag of its mini-batch's tokens; fresh tokens, c = 0 and SFT keep the scheduled rate, a
batch without versions is refused, and a negative c is refused with the field named."""

from __future__ import annotations

import numpy as np
import pytest
from _worker import make_batch

from meshrl.common.codec import Ragged
from meshrl.common.errors import ConfigError, InvalidArgument
from meshrl.trainer.batching import sequence_batch
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.losses import LossConfig
from meshrl.trainer.optim import OptimizerConfig
from meshrl.trainer.training import lag_step_scale


def _rows(vocab: int, weight_version: int, lags: list[int]) -> dict:
    batch = make_batch(vocab, rows=len(lags))
    offsets = batch["response_ids"].offsets
    versions = np.repeat(np.array([weight_version - lag for lag in lags], np.int32), np.diff(offsets))
    return dict(batch, rollout_logprobs=batch.pop("old_logprobs"), response_versions=Ragged(versions, offsets))


def test_the_factor_follows_the_mean_lag_of_the_steps_tokens():
    rows = _rows(100, weight_version=7, lags=[1, 1, 3, 0])
    batch = sequence_batch(rows, vocab_size=100, needed=["response_versions"])
    on = LossConfig(lag_lr_scale=1.0)
    assert lag_step_scale(on, batch, [0, 1], 7) == pytest.approx(0.5)
    assert lag_step_scale(LossConfig(lag_lr_scale=2.0), batch, [2], 7) == pytest.approx(1 / 7)
    assert lag_step_scale(on, batch, [3], 7) == 1.0  # fresh tokens
    assert lag_step_scale(on, batch, [3], 5) == 1.0  # versions the trainer has not reached count as fresh
    assert lag_step_scale(LossConfig(), batch, [0, 1], 7) == 1.0  # off
    assert lag_step_scale(LossConfig(policy_loss="sft", lag_lr_scale=1.0), batch, [0], 7) == 1.0
    mixed = lag_step_scale(on, batch, [0, 2], 7)  # token-weighted mean of lags 1 and 3
    lengths = np.diff(rows["response_ids"].offsets)[[0, 2]]
    assert mixed == pytest.approx(1 / (1 + (lengths[0] * 1 + lengths[1] * 3) / lengths.sum()))


@pytest.fixture()
def core(qwen2_dir):
    core = TrainerCore(micro_batch_tokens=4096)
    core.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3, warmup_steps=0))
    return core


def test_a_train_call_takes_the_scaled_rate(core):
    vocab = core.role("actor").spec.vocab_size
    loss = dict(old_logprobs="in-train", tis_cap=2.0, mis_cap=4.0)
    stale = core.train_step("actor", _rows(vocab, 0, [1] * 8), LossConfig(lag_lr_scale=1.0, **loss), mini_batches=2)
    assert stale.metrics["lr"] == pytest.approx(5e-4)
    fresh = core.train_step("actor", _rows(vocab, 0, [0] * 8), LossConfig(lag_lr_scale=1.0, **loss), mini_batches=2)
    assert fresh.metrics["lr"] == pytest.approx(1e-3)
    rows = _rows(vocab, 0, [1] * 8)
    del rows["response_versions"]
    with pytest.raises(InvalidArgument, match="response_versions"):
        core.train_step("actor", rows, LossConfig(lag_lr_scale=1.0, **loss))


def test_a_negative_scale_is_refused():
    with pytest.raises(ConfigError, match="loss.lag_lr_scale"):
        LossConfig(lag_lr_scale=-1.0)
