"""The `loss_mask` column of multi-turn trajectories: tokens it zeroes (the environment's) change nothing in a
train step, whatever their advantages and old log-probs, while the others train as before; token-mean counts
only the unmasked tokens; a mask not aligned with the responses is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _worker import make_batch

from meshrl.common import batch_schema as S
from meshrl.common.codec import Ragged
from meshrl.common.errors import InvalidArgument
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.losses import LossConfig
from meshrl.trainer.optim import OptimizerConfig

CFG = LossConfig(clip_low=0.2, clip_high=0.2, aggregation="token-mean")


def _core(model_dir) -> TrainerCore:
    core = TrainerCore(micro_batch_tokens=4096)
    core.load_model("actor", str(model_dir), optimizer=OptimizerConfig(lr=1e-2), seed=0)
    return core


def _step(model_dir, batch) -> tuple[dict, dict[str, torch.Tensor]]:
    core = _core(model_dir)
    metrics = core.train_step("actor", batch, CFG, micro_batch_tokens=24).metrics
    return metrics, {n: p.detach().clone() for n, p in core.role("actor").model.named_parameters()}


def test_masked_tokens_do_not_count_in_the_loss(qwen2_dir):
    core = _core(qwen2_dir)
    batch = make_batch(core.role("actor").spec.vocab_size, seed=1)
    batch[S.OLD_LOGPROBS] = core.compute_logprobs("actor", batch).values
    offsets = batch[S.RESPONSE_IDS].offsets
    rng = np.random.default_rng(0)
    mask = (rng.random(int(offsets[-1])) < 0.5).astype(np.float32)
    mask[offsets[:-1]] = 1.0  # every row keeps at least its first token
    batch[S.LOSS_MASK] = Ragged(mask, offsets)
    masked_metrics, masked = _step(qwen2_dir, batch)

    noisy = dict(batch)  # the masked tokens' advantages and old log-probs changed wildly
    adv = batch[S.ADVANTAGES].values.copy()
    old = batch[S.OLD_LOGPROBS].values.copy()
    adv[mask == 0] = 50.0 * rng.normal(size=int((mask == 0).sum()))
    old[mask == 0] = -0.01
    noisy[S.ADVANTAGES], noisy[S.OLD_LOGPROBS] = Ragged(adv, offsets), Ragged(old, offsets)
    noisy_metrics, after_noise = _step(qwen2_dir, noisy)
    assert noisy_metrics["loss"] == pytest.approx(masked_metrics["loss"], abs=1e-6)
    for name, p in masked.items():
        torch.testing.assert_close(after_noise[name], p, atol=1e-6, rtol=0)

    unmasked = {k: v for k, v in noisy.items() if k != S.LOSS_MASK}  # without the mask the noise trains
    plain_metrics, plain = _step(qwen2_dir, unmasked)
    assert abs(plain_metrics["loss"] - masked_metrics["loss"]) > 1e-3
    assert any(not torch.allclose(plain[n], p, atol=1e-6) for n, p in masked.items())


def test_a_misaligned_loss_mask_is_refused(qwen2_dir):
    core = _core(qwen2_dir)
    batch = make_batch(core.role("actor").spec.vocab_size)
    batch[S.LOSS_MASK] = Ragged(np.ones(3, np.float32), np.array([0, 3], np.int64))
    with pytest.raises(InvalidArgument, match="'loss_mask' is not aligned with response_ids"):
        core.train_step("actor", batch, CFG)
