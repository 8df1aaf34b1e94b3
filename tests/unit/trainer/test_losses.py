"""RL losses (meshrl.trainer.losses) against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from meshrl.common.errors import ConfigError
from meshrl.trainer.losses import (
    LossConfig,
    aggregate,
    entropy_from_logits,
    gspo_token_loss,
    importance_weights,
    kl_penalty,
    masked_is_weights,
    policy_objective,
    ppo_token_loss,
    truncated_is_weights,
    value_objective,
    value_token_loss,
)

ln = math.log


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_ppo_clip_higher():
    ratios = t([1.5, 0.5, 1.1, 0.7])
    logp, old = ratios.log(), torch.zeros(1, 4)
    adv = t([1.0, 1.0, -1.0, -1.0])
    loss, clipped, dual = ppo_token_loss(logp, old, adv, clip_low=0.2, clip_high=0.28)
    # r=1.5,A=1 -> max(-1.5, -1.28); r=0.5,A=1 -> max(-0.5, -0.8); r=1.1,A=-1 -> 1.1; r=0.7,A=-1 -> max(0.7, 0.8)
    torch.testing.assert_close(loss, t([-1.28, -0.5, 1.1, 0.8]))
    assert clipped.tolist() == [[True, False, False, True]]
    assert not dual.any()


def test_ppo_dual_clip_bounds_negative_advantages():
    logp, old = t([ln(5.0), ln(5.0)]), torch.zeros(1, 2)
    adv = t([-1.0, 1.0])
    loss, _, dual = ppo_token_loss(logp, old, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    # A=-1, r=5: max(5, 1.28) = 5, bounded by c * |A| = 3; A=+1 untouched: max(-5, -1.28)
    torch.testing.assert_close(loss, t([3.0, -1.28]))
    assert dual.tolist() == [[True, False]]


def test_ppo_gradient_is_zero_when_clipped():
    logp = t([ln(1.5), ln(0.9)]).requires_grad_()
    loss, _, _ = ppo_token_loss(logp, torch.zeros(1, 2), t([1.0, 1.0]))
    loss.sum().backward()
    # clipped token: no gradient; unclipped: d(-A * exp(logp))/dlogp = -ratio = -0.9
    torch.testing.assert_close(logp.grad, t([0.0, -0.9]))


def test_gspo_sequence_ratio():
    logp = t([ln(1.2), ln(0.8), 0.0], [ln(2.0), ln(2.0), 9.0]).requires_grad_()
    old = torch.zeros(2, 3)
    mask = t([1, 1, 0], [1, 1, 0])
    adv = t([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    loss, clipped = gspo_token_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    s = math.sqrt(1.2 * 0.8)  # geometric mean of the token ratios; padding ignored
    torch.testing.assert_close(loss[0, :2], torch.full((2,), -s))
    torch.testing.assert_close(loss[1, :2], torch.full((2,), -1.2))  # ratio 2 clipped at 1.2
    assert clipped[1, :2].all() and not clipped[0, :2].any()
    (loss * mask).sum().backward()
    torch.testing.assert_close(logp.grad[0, :2], torch.full((2,), -s))  # each token scaled by the sequence ratio
    assert logp.grad[1].abs().sum() == 0


def test_kl_estimators():
    logp, ref = t([ln(0.5)]), t([ln(0.25)])
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), t([ln(2)]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), t([0.5 * ln(2) ** 2]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), t([0.5 - 1 + ln(2)]))  # r = 0.5: r - 1 - ln r
    assert kl_penalty(ref, ref, "k3").item() == 0.0
    with pytest.raises(ConfigError):
        kl_penalty(logp, ref, "k4")


def test_entropy_from_logits():
    logits = torch.tensor([[[0.0, 0.0], [ln(0.75), ln(0.25)]]])
    expected = [[ln(2), -(0.75 * ln(0.75) + 0.25 * ln(0.25))]]
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor(expected))


def test_aggregation_modes():
    values = t([1.0, 2.0, 3.0], [4.0, 100.0, 100.0])
    mask = t([1, 1, 1], [1, 0, 0])
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(values, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(values, mask, "token-mean", denominator=10.0).item() == pytest.approx(1.0)
    # splitting a batch and summing with the global denominator equals the whole batch
    whole = aggregate(values, mask, "seq-mean-token-mean")
    parts = sum(aggregate(values[i : i + 1], mask[i : i + 1], "seq-mean-token-mean", 2.0) for i in range(2))
    torch.testing.assert_close(whole, parts)


def test_truncated_importance_sampling():
    w = truncated_is_weights(t([ln(3.0), ln(0.5)]), torch.zeros(1, 2), cap=2.0)
    torch.testing.assert_close(w, t([2.0, 0.5]))


def test_masked_importance_sampling_drops_tokens_above_the_cap():
    old, rollout = t([ln(3.0), ln(0.5), ln(1.5)]), torch.zeros(1, 3)
    torch.testing.assert_close(masked_is_weights(old, rollout, cap=2.0), t([0.0, 0.5, 1.5]))
    both = importance_weights(LossConfig(tis_cap=1.0, mis_cap=2.0), old, rollout)
    torch.testing.assert_close(both, t([0.0, 0.5, 1.0]))  # masked above 2, truncated at 1
    logp, adv, mask = t([ln(0.5)] * 3), t([1.0, 1.0, 1.0]), torch.ones(1, 3)
    loss, sums = policy_objective(
        LossConfig(mis_cap=2.0),
        mask,
        3.0,
        logprobs=logp,
        old_logprobs=logp + old,
        advantages=adv,
        rollout_logprobs=logp,
    )
    # decoupled PPO: ratio against the proximal (old) policy, weight old / behaviour (rollout): the masked
    # token adds nothing; the others add max(-A * r, -A * clip(r)) * w: ratio 2 -> -1.2 * 0.5, ratio 1/1.5 -> -(1/1.5) * 1.5
    assert sums["is_masked"] == 1.0
    assert loss.item() == pytest.approx((-1.2 * 0.5 - (1 / 1.5) * 1.5) / 3, abs=1e-6)
    with pytest.raises(ConfigError, match="rollout_logprobs"):
        policy_objective(LossConfig(mis_cap=2.0), mask, 3.0, logprobs=logp, advantages=adv)


def test_sequence_level_weights_take_the_whole_responses_ratio_on_each_of_its_tokens():
    # row 0: token ratios 2 and 1.5 (product 3), then padding whose log-probs are junk; row 1: ratios 0.5, 1
    old = torch.tensor([[ln(2.0), ln(1.5), 7.0], [ln(0.5), 0.0, 0.0]])
    rollout = torch.tensor([[0.0, 0.0, -3.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    cfg = LossConfig(tis_cap=4.0, is_level="sequence")
    torch.testing.assert_close(importance_weights(cfg, old, rollout, mask), torch.tensor([[3.0] * 3, [0.5] * 3]))
    truncated = importance_weights(cfg.over({"tis_cap": 2.0}), old, rollout, mask)
    torch.testing.assert_close(truncated, torch.tensor([[2.0] * 3, [0.5] * 3]))
    masked = importance_weights(LossConfig(mis_cap=2.0, is_level="sequence"), old, rollout, mask)
    torch.testing.assert_close(masked, torch.tensor([[0.0] * 3, [0.5] * 3]))  # the whole response leaves
    per_token = importance_weights(LossConfig(tis_cap=4.0), old, rollout, mask)
    torch.testing.assert_close(per_token[:, :2], torch.tensor([[2.0, 1.5], [0.5, 1.0]]))
    # in the objective only the response's tokens count: the padding's junk log-probs change nothing
    logp, adv = torch.zeros(2, 3), torch.ones(2, 3)
    _, sums = policy_objective(
        cfg, mask, 4.0, logprobs=logp, old_logprobs=old, advantages=adv, rollout_logprobs=rollout
    )
    assert sums["tis_weight"] == pytest.approx(3.0 * 2 + 0.5 * 2)


def test_value_loss_with_clip():
    values, old, returns = t([1.0, 1.0]), t([0.5, 0.9]), t([2.0, 0.0])
    loss, clipped = value_token_loss(values, old, returns, clip=0.2)
    # token 0: V clipped to 0.7 -> (0.7-2)^2 = 1.69 > 1; token 1: clipped to 1.0 -> equal, 1
    torch.testing.assert_close(loss, t([0.845, 0.5]))
    assert clipped.tolist() == [[True, False]]
    torch.testing.assert_close(value_token_loss(values, old, returns, clip=0.0)[0], t([0.5, 0.5]))
    total, sums = value_objective(
        LossConfig(policy_loss="value"), torch.ones(1, 2), 2.0, values=values, returns=returns, old_values=old
    )
    assert total.item() == pytest.approx((0.845 + 0.5) / 2) and sums["vf_clipped"] == 1.0


def test_policy_objective_combines_terms():
    logp = t([ln(0.5), ln(0.5)])
    ref = t([ln(0.25), ln(0.5)])
    adv = t([1.0, -1.0])
    mask = torch.ones(1, 2)
    entropy = t([0.3, 0.1])
    cfg = LossConfig(kl_coef=0.1, kl_estimator="k1", entropy_coef=0.5)
    loss, sums = policy_objective(cfg, mask, 2.0, logprobs=logp, advantages=adv, ref_logprobs=ref, entropy=entropy)
    # on-policy ratio 1: pg = mean(-A) = 0; kl k1 mean = ln2/2; entropy mean 0.2
    assert loss.item() == pytest.approx(0.1 * ln(2) / 2 - 0.5 * 0.2, abs=1e-6)
    assert sums["tokens"] == 2 and sums["clipped"] == 0 and sums["kl"] == pytest.approx(ln(2))
    sft, _ = policy_objective(LossConfig(policy_loss="sft"), mask, 2.0, logprobs=logp)
    assert sft.item() == pytest.approx(-ln(0.5))
    tis = LossConfig(tis_cap=2.0)
    loss_tis, sums_tis = policy_objective(
        tis, mask, 2.0, logprobs=logp, advantages=adv, rollout_logprobs=t([ln(0.1), ln(0.5)])
    )
    # weights [min(5, 2), 1]: (-1 * 2 + 1 * 1) / 2
    assert loss_tis.item() == pytest.approx(-0.5) and sums_tis["tis_weight"] == pytest.approx(3.0)
    with pytest.raises(ConfigError, match="advantages"):
        policy_objective(LossConfig(), mask, 2.0, logprobs=logp)
    with pytest.raises(ConfigError, match="ref_logprobs"):
        policy_objective(LossConfig(kl_coef=0.1), mask, 2.0, logprobs=logp, advantages=adv)


def test_loss_config_validation():
    with pytest.raises(ConfigError, match="loss.aggregation"):
        LossConfig(aggregation="mean")
    with pytest.raises(ConfigError, match="loss.dual_clip"):
        LossConfig(dual_clip=0.5)
    with pytest.raises(ConfigError, match="loss.policy_loss"):
        LossConfig(policy_loss="dpo")
    # pi_old from the rollout is the behaviour policy: an importance weight against it would always be 1
    with pytest.raises(ConfigError, match="old_logprobs = 'rollout' makes them the same policy"):
        LossConfig(old_logprobs="rollout", tis_cap=2.0)
    with pytest.raises(ConfigError, match="set tis_cap and mis_cap to 0"):
        LossConfig(old_logprobs="rollout", mis_cap=5.0)
    assert LossConfig(old_logprobs="rollout").old_logprobs == "rollout"


def test_value_clip_metric_counts_only_tokens_the_clip_moved():
    """Values within the clip range are not clipped, even where old + (v - old) != v in fp32."""
    g = torch.Generator().manual_seed(0)
    old = 0.003 * torch.randn(1, 4096, generator=g)
    values = 0.1 * torch.randn(1, 4096, generator=g)  # |v - old| < 0.5 everywhere
    returns = torch.randn(1, 4096, generator=g)
    assert bool(((old + (values - old)) != values).any())  # the rounding that used to count as clipping
    loss, clipped = value_token_loss(values, old, returns, clip=0.5)
    assert int(clipped.sum()) == 0
    assert torch.equal(loss, 0.5 * (values - returns).square())


def test_value_clip_zero_turns_clipping_off():
    old, values, returns = torch.zeros(1, 3), torch.tensor([[0.0, 1.0, -2.0]]), torch.tensor([[3.0, 2.0, -3.0]])
    _, sums = value_objective(
        LossConfig(policy_loss="value", value_clip=0.0),
        torch.ones(1, 3),
        3.0,
        values=values,
        returns=returns,
        old_values=old,
    )
    assert sums["vf_clipped"] == 0.0
    _, clipped = value_objective(
        LossConfig(policy_loss="value"), torch.ones(1, 3), 3.0, values=values, returns=returns, old_values=old
    )
    assert clipped["vf_clipped"] == 2.0  # the default clip 0.2 moves the two values that left +-0.2
