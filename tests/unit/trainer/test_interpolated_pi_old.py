"""old_logprobs = 'interpolated' (AReaL's proximal approximation, no forward pass): pi_old per token between the
rollout's log-probs and the current policy by version lag; on fresh tokens it is the 'rollout' call exactly, on
one-version-old tokens the recompute call given the interpolated values, and a batch without versions is
refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _worker import make_batch

from meshrl.common.codec import Ragged
from meshrl.common.errors import InvalidArgument
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.losses import LossConfig, interpolated_proximal
from meshrl.trainer.optim import OptimizerConfig

LOSS = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.0, tis_cap=2.0)


def test_the_proximal_policy_moves_toward_the_current_one_with_the_lag():
    current = torch.tensor([[-1.0, -1.0, -1.0, -1.0]], requires_grad=True)
    rollout = torch.tensor([[-3.0, -3.0, -3.0, -3.0]])
    versions = torch.tensor([[5.0, 4.0, 2.0, 6.0]])  # lags 0, 1, 3 and -1 (a version the trainer has not seen)
    prox = interpolated_proximal(current, rollout, versions, weight_version=5)
    torch.testing.assert_close(prox, torch.tensor([[-3.0, -2.0, -1.5, -3.0]]))  # a = 0, 1/2, 3/4, 0
    assert not prox.requires_grad


def _core(qwen2_dir) -> TrainerCore:
    core = TrainerCore(micro_batch_tokens=4096)
    core.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2))
    return core


def _rows(core, lag: int) -> dict:
    batch = make_batch(core.role("actor").spec.vocab_size)
    behaviour = batch.pop("old_logprobs")
    offsets = batch["response_ids"].offsets
    versions = np.full(int(offsets[-1]), core.role("actor").weight_version - lag, np.int32)
    return dict(batch, rollout_logprobs=behaviour, response_versions=Ragged(versions, offsets))


def _same(got, want) -> None:
    for key in ("loss", "pg_loss", "clip_fraction", "ratio", "tis_weight", "grad_norm"):
        assert got.metrics[key] == pytest.approx(want.metrics[key], rel=1e-6, abs=1e-7), key


def test_fresh_tokens_take_the_rollout_log_probs(qwen2_dir):
    got_core, want_core = _core(qwen2_dir), _core(qwen2_dir)
    rows = _rows(got_core, lag=0)
    got = got_core.train_step("actor", rows, LossConfig(old_logprobs="interpolated", **LOSS), mini_batches=2)
    want = want_core.train_step(
        "actor", dict(rows, old_logprobs=rows["rollout_logprobs"]), LossConfig(**LOSS), mini_batches=2
    )
    assert got.old_logprobs is None and "perf/old_logprob_seconds" not in got.metrics  # no pass was made
    assert got.metrics["tis_weight"] == pytest.approx(1.0)
    _same(got, want)


def test_one_version_old_tokens_sit_halfway_to_the_current_policy(qwen2_dir):
    got_core, want_core = _core(qwen2_dir), _core(qwen2_dir)
    rows = _rows(got_core, lag=1)
    current = want_core.compute_logprobs("actor", rows).values
    behaviour = rows["rollout_logprobs"]
    halfway = Ragged((behaviour.values + 0.5 * (current.values - behaviour.values)).astype(np.float32), current.offsets)
    # one mini-batch: the policy being trained is still the one the call starts from
    got = got_core.train_step("actor", rows, LossConfig(old_logprobs="interpolated", **LOSS), mini_batches=1)
    want = want_core.train_step("actor", dict(rows, old_logprobs=halfway), LossConfig(**LOSS), mini_batches=1)
    assert got.metrics["tis_weight"] != pytest.approx(1.0) and not math.isnan(got.metrics["ratio"])
    _same(got, want)


def test_a_batch_without_versions_is_refused(qwen2_dir):
    core = _core(qwen2_dir)
    rows = _rows(core, lag=1)
    del rows["response_versions"]
    with pytest.raises(InvalidArgument, match="response_versions"):
        core.train_step("actor", rows, LossConfig(old_logprobs="interpolated", **LOSS))
