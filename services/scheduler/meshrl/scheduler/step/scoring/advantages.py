"""Advantage estimators in numpy: GRPO, RLOO, REINFORCE++, GAE (and token broadcasting / whitening).

Used by the scheduler's COMPUTE (advantage) nodes and by the trainer. Scalar-per-sample inputs are
arrays [N] (rewards float, group_index int64: the prompt each sample belongs to); per-token values are
ragged: flat float32 values [total] with int64 offsets [N + 1] (the layout of `batch_schema` columns,
e.g. `Ragged(values, offsets)` from `meshrl.common.codec`). Outputs are float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshrl.common.errors import InvalidArgument


def _check_rows(name: str, array: np.ndarray, n: int) -> None:
    if array.ndim != 1 or array.shape[0] != n:
        raise InvalidArgument(f"{name} must be a 1-D array of {n} entries (one per sample), got shape {array.shape}")


def _check_offsets(offsets: np.ndarray, total: int | None = None) -> np.ndarray:
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise InvalidArgument("offsets must be a non-decreasing 1-D int array starting at 0 (n + 1 row boundaries)")
    if total is not None and offsets[-1] != total:
        raise InvalidArgument(f"offsets end at {offsets[-1]}, but the per-token values have {total} entries")
    return offsets


def _group_stats(rewards: Any, group_index: Any):
    """(rewards as float64, (inverse, counts, means, squared deviations) per group), or stats None when empty."""
    rewards = np.asarray(rewards, dtype=np.float64)
    group_index = np.asarray(group_index)
    _check_rows("group_index", group_index, rewards.shape[0])
    if rewards.size == 0:
        return rewards, None
    _, inverse, counts = np.unique(group_index, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=rewards)
    means = sums / counts
    sq = np.bincount(inverse, weights=(rewards - means[inverse]) ** 2)
    return rewards, (inverse, counts, means, sq)


def grpo_advantages(
    rewards: np.ndarray, group_index: np.ndarray, *, normalize_std: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """GRPO: A_i = (r_i - mean_g) / (std_g + eps) over the samples of the same prompt (group).

    std is the unbiased sample std (ddof=1; 0 for a group of one). normalize_std=False gives Dr. GRPO's
    A_i = r_i - mean_g. A group whose rewards are all equal gets advantage 0. Returns float32 [N].
    """
    rewards, stats = _group_stats(rewards, group_index)
    if stats is None:
        return np.zeros(0, np.float32)
    inverse, counts, means, sq = stats
    adv = rewards - means[inverse]
    if normalize_std:
        std = np.sqrt(sq / np.maximum(counts - 1, 1))
        adv = adv / (std[inverse] + eps)
    return adv.astype(np.float32)


def zero_variance_share(rewards: np.ndarray, group_index: np.ndarray, *, tol: float = 1e-9) -> float:
    """Share of the groups (of two or more samples) whose rewards are all equal: a group-relative estimator gives
    them advantage 0, so they teach nothing. Near 1 from the first steps, RL cannot learn from this start (too
    sure, or the reward too coarse for it). 0.0 for an empty batch or one of single-sample groups."""
    rewards, stats = _group_stats(rewards, group_index)
    if stats is None:
        return 0.0
    _, counts, _, sq = stats
    several = counts > 1
    return float((sq[several] <= tol * counts[several]).mean()) if several.any() else 0.0


def rloo_advantages(rewards: np.ndarray, group_index: np.ndarray) -> np.ndarray:
    """RLOO: A_i = r_i - mean of the other samples of its group = n / (n - 1) * (r_i - mean_g).

    A group of one sample has no baseline and gets advantage 0. Returns float32 [N].
    """
    rewards, stats = _group_stats(rewards, group_index)
    if stats is None:
        return np.zeros(0, np.float32)
    inverse, counts, means, _ = stats
    n = counts[inverse].astype(np.float64)
    adv = np.where(n > 1, n / np.maximum(n - 1, 1) * (rewards - means[inverse]), 0.0)
    return adv.astype(np.float32)


def broadcast_to_tokens(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Repeats one value per sample over that sample's tokens: [N] -> flat [total]."""
    offsets = _check_offsets(offsets)
    values = np.asarray(values)
    _check_rows("values", values, offsets.size - 1)
    return np.repeat(values, np.diff(offsets)).astype(np.float32)


def terminal_token_rewards(
    rewards: np.ndarray, offsets: np.ndarray, *, token_kl: np.ndarray | None = None, kl_coef: float = 0.0
) -> np.ndarray:
    """Per-token rewards: -kl_coef * kl_t on every token, plus the sample's reward on its last token.

    token_kl: flat [total] per-token KL estimate (e.g. old_logprobs - ref_logprobs). Empty responses
    carry no token, so their reward is dropped. Returns flat float32 [total].
    """
    offsets = _check_offsets(offsets)
    rewards = np.asarray(rewards, dtype=np.float64)
    _check_rows("rewards", rewards, offsets.size - 1)
    total = int(offsets[-1])
    out = np.zeros(total, np.float64)
    if token_kl is not None and kl_coef:
        token_kl = np.asarray(token_kl, dtype=np.float64)
        if token_kl.shape != (total,):
            raise InvalidArgument(f"token_kl must have {total} entries (one per response token), got {token_kl.shape}")
        out -= kl_coef * token_kl
    lengths = np.diff(offsets)
    nonempty = lengths > 0
    np.add.at(out, offsets[1:][nonempty] - 1, rewards[nonempty])
    return out.astype(np.float32)


def _padded(flat: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat [total] -> right-padded [N, T_max] (zeros) and the boolean mask of real entries."""
    lengths = np.diff(offsets)
    width = int(lengths.max()) if lengths.size else 0
    mask = np.arange(width)[None, :] < lengths[:, None]
    out = np.zeros(mask.shape, dtype=np.float64)
    out[mask] = flat
    return out, mask


def _reverse_scan(x: np.ndarray, decay: float) -> np.ndarray:
    """y_t = x_t + decay * y_{t+1} along the last axis of [N, T] (zero-padded tails contribute nothing)."""
    y = np.zeros_like(x)
    running = np.zeros(x.shape[0])
    for t in range(x.shape[1] - 1, -1, -1):
        running = x[:, t] + decay * running
        y[:, t] = running
    return y


def discounted_returns(token_rewards: np.ndarray, offsets: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """G_t = sum_{k >= t} gamma^(k - t) r_k within each sample. Flat [total] -> flat float32 [total]."""
    token_rewards = np.asarray(token_rewards, dtype=np.float64)
    offsets = _check_offsets(offsets, token_rewards.shape[0])
    padded, mask = _padded(token_rewards, offsets)
    return _reverse_scan(padded, gamma)[mask].astype(np.float32)


def whiten(values: np.ndarray, *, shift_mean: bool = True, eps: float = 1e-8) -> np.ndarray:
    """(x - mean) / (std + eps) over all entries (population std); shift_mean=False keeps the mean."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return values.astype(np.float32)
    mean = values.mean()
    out = (values - mean) / (values.std() + eps)
    if not shift_mean:
        out = out + mean
    return out.astype(np.float32)


def reinforce_pp_advantages(
    rewards: np.ndarray,
    offsets: np.ndarray,
    *,
    token_kl: np.ndarray | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> np.ndarray:
    """REINFORCE++: discounted returns of the per-token rewards (terminal reward, optional -kl_coef * KL
    per token), normalised over every token of the batch: A = (G - mean) / (std + eps). Flat float32 [total]."""
    token_rewards = terminal_token_rewards(rewards, offsets, token_kl=token_kl, kl_coef=kl_coef)
    returns = discounted_returns(token_rewards, offsets, gamma)
    return whiten(returns, eps=eps)


def gae_advantages(
    token_rewards: np.ndarray, values: np.ndarray, offsets: np.ndarray, *, gamma: float = 1.0, lam: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation per token, each sample ending in a terminal state (V after it = 0).

    delta_t = r_t + gamma * V_{t+1} - V_t; A_t = delta_t + gamma * lam * A_{t+1}; returns R_t = A_t + V_t.
    token_rewards, values: flat [total]. Returns (advantages, returns), flat float32 [total] each.
    """
    token_rewards = np.asarray(token_rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    offsets = _check_offsets(offsets, token_rewards.shape[0])
    if values.shape != token_rewards.shape:
        raise InvalidArgument(f"values has shape {values.shape}, token_rewards {token_rewards.shape}; they must match")
    rewards_p, mask = _padded(token_rewards, offsets)
    values_p, _ = _padded(values, offsets)
    next_values = np.zeros_like(values_p)
    next_values[:, :-1] = values_p[:, 1:]  # padding is 0, so V after the last token is 0 (terminal)
    deltas = np.where(mask, rewards_p + gamma * next_values - values_p, 0.0)
    adv = _reverse_scan(deltas, gamma * lam)[mask]
    return adv.astype(np.float32), (adv + values).astype(np.float32)
