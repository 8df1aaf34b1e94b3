"""Advantage estimators (meshrl.scheduler.step.scoring.advantages) against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.step.scoring.advantages import (
    broadcast_to_tokens,
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    terminal_token_rewards,
    whiten,
    zero_variance_share,
)

OFFSETS = np.array([0, 2, 5])


def test_grpo_with_and_without_std():
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0])
    groups = np.array([0, 0, 0, 0, 1, 1])
    # group 0: mean 0.5, sample std sqrt(1/3) = 0.57735 -> +-0.5 / 0.57735 = +-0.866025; group 1: all equal -> 0
    np.testing.assert_allclose(
        grpo_advantages(rewards, groups), [0.866025, -0.866025, -0.866025, 0.866025, 0, 0], atol=1e-5
    )
    np.testing.assert_allclose(grpo_advantages(rewards, groups, normalize_std=False), [0.5, -0.5, -0.5, 0.5, 0, 0])
    assert grpo_advantages(rewards, groups).dtype == np.float32
    # groups need not be contiguous or sorted
    np.testing.assert_allclose(grpo_advantages(np.array([3.0, 1.0]), np.array([7, 7]), normalize_std=False), [1, -1])


def test_rloo_leaves_one_out():
    rewards = np.array([1.0, 0.0, 0.0, 5.0])
    groups = np.array([0, 0, 0, 1])
    # r0 - mean(0, 0) = 1; r1 - mean(1, 0) = -0.5; r2 likewise; a group of one has no baseline -> 0
    np.testing.assert_allclose(rloo_advantages(rewards, groups), [1.0, -0.5, -0.5, 0.0])


def test_token_rewards_and_discounted_returns():
    kl = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    tokens = terminal_token_rewards(np.array([1.0, 2.0]), OFFSETS, token_kl=kl, kl_coef=0.5)
    np.testing.assert_allclose(tokens, [-0.05, 0.9, -0.15, -0.2, 1.75], atol=1e-6)
    # [1, 2] -> G = [1 + 0.5 * 2, 2]; [0, 0, 4] -> [1, 2, 4]
    np.testing.assert_allclose(discounted_returns(np.array([1.0, 2, 0, 0, 4]), OFFSETS, 0.5), [2, 2, 1, 2, 4])
    np.testing.assert_allclose(broadcast_to_tokens(np.array([3.0, -1.0]), OFFSETS), [3, 3, -1, -1, -1])


def test_reinforce_pp_normalises_returns_over_the_batch():
    # terminal rewards 2 and 4, gamma 0.5: returns [1, 2 | 1, 2, 4]... computed by hand below
    adv = reinforce_pp_advantages(np.array([2.0, 4.0]), OFFSETS, gamma=0.5)
    returns = np.array([1.0, 2.0, 1.0, 2.0, 4.0])
    mean, std = 2.0, np.sqrt(((returns - 2.0) ** 2).mean())  # std = sqrt(1.2)
    np.testing.assert_allclose(adv, (returns - mean) / std, atol=1e-6)
    np.testing.assert_allclose(adv, [-0.912871, 0.0, -0.912871, 0.0, 1.825742], atol=1e-5)
    # with a per-token KL penalty the returns change before normalisation
    kl = np.array([1.0, 0.0, 0.0, 0.0, 0.0])
    with_kl = reinforce_pp_advantages(np.array([2.0, 4.0]), OFFSETS, token_kl=kl, kl_coef=1.0, gamma=0.5)
    np.testing.assert_allclose(with_kl, whiten(np.array([0.0, 2.0, 1.0, 2.0, 4.0])), atol=1e-6)


def test_gae_by_hand():
    rewards, values, offsets = np.array([0.0, 0.0, 1.0]), np.array([0.5, 0.5, 0.5]), np.array([0, 3])
    # gamma 1, lam 0.5: deltas [0, 0, 0.5] -> A = [0.125, 0.25, 0.5]; returns = A + V
    adv, ret = gae_advantages(rewards, values, offsets, gamma=1.0, lam=0.5)
    np.testing.assert_allclose(adv, [0.125, 0.25, 0.5])
    np.testing.assert_allclose(ret, [0.625, 0.75, 1.0])
    # lam 1 reduces to discounted return minus value: G = [0.81, 0.9, 1] - 0.5
    adv, _ = gae_advantages(rewards, values, offsets, gamma=0.9, lam=1.0)
    np.testing.assert_allclose(adv, [0.31, 0.4, 0.5], atol=1e-6)
    # two samples are independent (no bootstrapping across the boundary)
    adv2, _ = gae_advantages(np.array([1.0, 0, 0, 1]), np.array([0.0, 0.5, 0.5, 0.5]), np.array([0, 1, 4]), lam=0.5)
    np.testing.assert_allclose(adv2, [1.0, 0.125, 0.25, 0.5])


def test_empty_rows_and_bad_shapes():
    offsets = np.array([0, 0, 2])
    np.testing.assert_allclose(terminal_token_rewards(np.array([9.0, 1.0]), offsets), [0.0, 1.0])
    with pytest.raises(InvalidArgument, match="offsets end at 2"):
        gae_advantages(np.zeros(3), np.zeros(3), offsets)
    with pytest.raises(InvalidArgument, match="group_index"):
        grpo_advantages(np.zeros(3), np.zeros(2))
    with pytest.raises(InvalidArgument, match="token_kl"):
        terminal_token_rewards(np.zeros(2), offsets, token_kl=np.zeros(5), kl_coef=1.0)


def test_zero_variance_share_counts_groups_whose_samples_all_scored_the_same():
    # group 0 mixed, group 1 all 0.5, group 2 all 0 (interleaved rows), group 3 a single sample (not counted)
    rewards = np.array([1.0, 0.5, 0.0, 0.0, 0.5, 0.0, 0.25])
    groups = np.array([0, 1, 2, 0, 1, 2, 3])
    assert zero_variance_share(rewards, groups) == pytest.approx(2 / 3)
    assert zero_variance_share(np.array([0.2, 0.3]), np.array([5, 5])) == 0.0
    assert zero_variance_share(np.array([0.3]), np.array([0])) == 0.0
    assert zero_variance_share(np.zeros(0), np.zeros(0, np.int64)) == 0.0
    # the same share GRPO leaves without a gradient: its advantages are 0 in exactly those groups
    adv = grpo_advantages(rewards, groups)
    assert adv[[1, 4, 2, 5]].tolist() == [0.0] * 4 and np.all(adv[[0, 3]] != 0)
