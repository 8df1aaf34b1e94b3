"""RL objectives as small pure torch functions over padded per-token tensors.

Every per-token tensor is [B, T] (B sequences, T response positions) with a float mask [B, T]
(1 = a real response token). Per-token functions return [B, T] values; `aggregate` reduces them
with a caller-supplied denominator so gradient accumulation over micro-batches and data-parallel
ranks equals one big batch. The settings they take are `LossConfig` (meshrl.common.loss_config, their one
definition). Called by `meshrl.trainer.core` (train steps) and tested against hand-computed cases.
"""

from __future__ import annotations

import torch

from meshrl.common.errors import ConfigError
from meshrl.common.loss_config import LossConfig

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
POLICY_LOSSES = ("ppo", "gspo", "sft", "value")
KL_ESTIMATORS = ("k1", "k2", "k3")
_MAX_LOG_RATIO = 20.0  # exp() of a larger log-ratio overflows float32 usefulness; clamp before exponentiating


# --- aggregation ---------------------------------------------------------------------------


def loss_denominator(mask: torch.Tensor, aggregation: str) -> float:
    """The local normaliser of `aggregate`: number of tokens (token-mean) or of non-empty sequences."""
    if aggregation == "token-mean":
        return float(mask.sum())
    return float((mask.sum(dim=-1) > 0).sum())


def aggregate(values: torch.Tensor, mask: torch.Tensor, aggregation: str, denominator: float | None = None):
    """Reduces per-token `values` [B, T] to a scalar.

    token-mean: sum over all tokens / number of tokens (DAPO's token-level loss).
    seq-mean-token-sum: sum over each sequence's tokens, averaged over sequences (Dr. GRPO style).
    seq-mean-token-mean: mean over each sequence's tokens, averaged over sequences (original GRPO).
    `denominator` overrides the token / sequence count, e.g. with the global count of a whole mini-batch.
    """
    if aggregation not in AGGREGATIONS:
        raise ConfigError("aggregation", aggregation, "unknown aggregation", f"use one of {AGGREGATIONS}")
    mask = mask.to(values.dtype)
    denom = loss_denominator(mask, aggregation) if denominator is None else denominator
    denom = max(denom, 1.0)
    if aggregation == "token-mean":
        return (values * mask).sum() / denom
    per_seq = (values * mask).sum(dim=-1)
    if aggregation == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(dim=-1).clamp(min=1.0)
    return per_seq.sum() / denom


# --- per-token terms -----------------------------------------------------------------------


def ppo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token, with asymmetric clip and optional dual clip.

    ratio = exp(logprobs - old_logprobs); loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high));
    with dual_clip c > 1, tokens with A < 0 have their loss bounded by -c * A.
    Returns (loss [B, T], clipped [B, T] bool: the clip branch was taken, dual_clipped [B, T] bool).
    """
    ratio = torch.exp((logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    unclipped = -advantages * ratio
    clipped_loss = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped_loss)
    clipped = clipped_loss > unclipped
    dual = torch.zeros_like(clipped)
    if dual_clip:
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
    return loss, clipped, dual


def gspo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO: one importance ratio per sequence, s_i = exp(mean over its tokens of (logprobs - old_logprobs)).

    Token-level form: s_it = sg[s_i] * exp(logprobs_t - sg[logprobs_t]), equal to s_i in value, with the
    gradient of each token's log-prob scaled by s_i. loss = max(-A * s, -A * clip(s, 1 - low, 1 + high)).
    Returns (loss [B, T] (each sequence's tokens carry its loss), clipped [B, T] bool).
    """
    mask = mask.to(logprobs.dtype)
    log_ratio = ((logprobs - old_logprobs) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    seq_ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)).detach()[:, None]
    ratio = seq_ratio * torch.exp(logprobs - logprobs.detach())
    unclipped = -advantages * ratio
    clipped_loss = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped_loss), clipped_loss > unclipped


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's estimators).

    k1 = log r' with r' = pi / pi_ref (unbiased, high variance); k2 = 0.5 * (log r')^2;
    k3 = r - 1 - log r with r = pi_ref / pi (unbiased, low variance, always >= 0).
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        neg = (-log_ratio).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return torch.exp(neg) - 1.0 - neg
    raise ConfigError("kl_estimator", estimator, "unknown estimator", f"use one of {KL_ESTIMATORS}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: logits [..., V] -> [...] (float32)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def truncated_is_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling weights min(pi_old / pi_rollout, cap), detached.

    Corrects the policy gradient for the mismatch between the trainer's and the rollout engine's
    probabilities of the same tokens (off-policy rollout); multiply the per-token policy loss by it.
    """
    ratio = torch.exp((old_logprobs - rollout_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    return ratio.clamp(max=cap).detach()


def masked_is_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Masked importance sampling weights: pi_old / pi_rollout where it is at most `cap`, else 0, detached.

    Unlike truncation, a token the rollout sampled far more readily than the trainer would (a stale or
    mismatched behaviour policy) is left out of the gradient instead of counted at the cap.
    """
    ratio = torch.exp((old_logprobs - rollout_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    return torch.where(ratio <= cap, ratio, torch.zeros_like(ratio)).detach()


def interpolated_proximal(
    logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, versions: torch.Tensor, weight_version: int
) -> torch.Tensor:
    """Decoupled PPO's proximal log-probs without a forward pass (old_logprobs = 'interpolated', AReaL's
    approximation): log pi_prox = log pi_behaviour + a * (log pi_theta - log pi_behaviour), detached, with
    a = (v_prox - v_behaviour) / (v_theta - v_behaviour) = lag / (lag + 1) per token, taking the proximal policy
    at the trainer's `weight_version` (v_prox) and the policy being trained as the next version (v_theta).
    `versions` [B, T]: the version that generated each token; a token 0 versions old gets its rollout log-prob
    (exact on-policy), and the older a token, the nearer its pi_prox is to the current policy's."""
    lag = (float(weight_version) - versions).clamp(min=0.0)
    alpha = lag / (lag + 1.0)
    return (rollout_logprobs + alpha * (logprobs.detach() - rollout_logprobs)).detach()


def per_sequence_sum(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Each row's sum over its `mask`ed tokens (every token when None), on each of the row's positions: [B, T]."""
    kept = values if mask is None else values * mask.to(values.dtype)
    return kept.sum(-1, keepdim=True).expand_as(values)


def importance_weights(
    cfg: LossConfig, old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Decoupled PPO's behaviour correction: the PPO ratio is taken against the proximal policy (`old`, the
    trainer's log-probs before the update) and each token's loss is weighted by pi_old / pi_behaviour (the
    rollout's own log-probs), truncated at tis_cap and/or masked above mis_cap. With is_level 'sequence' the
    weight of every token of a sequence is the product of the ratios of its tokens in `mask` (the response's
    whole ratio), truncated or masked as one."""
    if cfg.is_level == "sequence":
        old, rollout = per_sequence_sum(old, mask), per_sequence_sum(rollout, mask)
    weights = truncated_is_weights(old, rollout, cfg.tis_cap) if cfg.tis_cap else None
    if cfg.mis_cap:
        masked = masked_is_weights(old, rollout, cfg.mis_cap)
        weights = masked if weights is None else torch.where(masked > 0, weights, torch.zeros_like(weights))
    return weights


def value_token_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, *, clip: float = 0.2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Critic loss per token: 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, +-clip).

    clip = 0 disables clipping (plain 0.5 * (V - R)^2). Returns (loss [B, T], clipped [B, T] bool).
    """
    plain = (values - returns).square()
    if not clip:
        return 0.5 * plain, torch.zeros_like(plain, dtype=torch.bool)
    delta = values - old_values
    active = delta.abs() > clip  # where the clip moves the value; elsewhere V_clip is V itself, bit for bit
    v_clip = torch.where(active, old_values + delta.clamp(-clip, clip), values)
    clipped_sq = (v_clip - returns).square()
    return 0.5 * torch.maximum(plain, clipped_sq), active & (clipped_sq > plain)


# --- the objectives of a train step -----------------------------------------------------------


def _require(name: str, tensor: torch.Tensor | None, why: str) -> torch.Tensor:
    if tensor is None:
        raise ConfigError(f"batch column {name}", None, f"missing, but {why}", f"write '{name}' to the batch first")
    return tensor


def policy_objective(
    cfg: LossConfig,
    mask: torch.Tensor,
    denominator: float,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor loss of one micro-batch: policy term (+ kl_coef * KL) (- entropy_coef * entropy).

    Every tensor is [B, T] aligned with response tokens. old_logprobs defaults to logprobs.detach()
    (on-policy: ratio 1). Returns (loss scalar, already divided by `denominator`; metric sums over this
    micro-batch's tokens: tokens, pg_loss, kl, entropy, clipped, dual_clipped, ratio, tis_weight, is_masked).
    """
    mask = mask.to(logprobs.dtype)
    agg = cfg.aggregation
    sums: dict[str, float] = {"tokens": float(mask.sum())}
    if cfg.policy_loss == "sft":
        token_loss = -logprobs
    else:
        advantages = _require("advantages", advantages, f"policy_loss={cfg.policy_loss!r} needs advantages")
        old = logprobs.detach() if old_logprobs is None else old_logprobs
        if cfg.policy_loss == "gspo":
            token_loss, clipped = gspo_token_loss(
                logprobs, old, advantages, mask, clip_low=cfg.clip_low, clip_high=cfg.clip_high
            )
            dual = torch.zeros_like(clipped)
        else:
            token_loss, clipped, dual = ppo_token_loss(
                logprobs, old, advantages, clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip
            )
        if cfg.tis_cap or cfg.mis_cap:
            rollout = _require("rollout_logprobs", rollout_logprobs, "tis_cap / mis_cap > 0 correct against them")
            weights = importance_weights(cfg, old, rollout, mask)
            token_loss = token_loss * weights
            sums["tis_weight"] = float((weights * mask).sum())
            sums["is_masked"] = float(((weights == 0).to(mask.dtype) * mask).sum())
        sums["clipped"] = float((clipped.to(mask.dtype) * mask).sum())
        sums["dual_clipped"] = float((dual.to(mask.dtype) * mask).sum())
        sums["ratio"] = float((torch.exp(logprobs.detach() - old) * mask).sum())
    loss = aggregate(token_loss, mask, agg, denominator)
    sums["pg_loss"] = float(loss.detach())
    if cfg.kl_coef:
        ref = _require("ref_logprobs", ref_logprobs, "kl_coef > 0 penalises KL to the reference")
        kl = kl_penalty(logprobs, ref, cfg.kl_estimator)
        loss = loss + cfg.kl_coef * aggregate(kl, mask, agg, denominator)
        sums["kl"] = float((kl.detach() * mask).sum())
    elif ref_logprobs is not None:
        sums["kl"] = float((kl_penalty(logprobs.detach(), ref_logprobs, cfg.kl_estimator) * mask).sum())
    if entropy is not None:
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * aggregate(entropy, mask, agg, denominator)
        sums["entropy"] = float((entropy.detach() * mask).sum())
    return loss, sums


def value_objective(
    cfg: LossConfig,
    mask: torch.Tensor,
    denominator: float,
    *,
    values: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The critic loss of one micro-batch (value_token_loss aggregated); old_values default to values.detach()."""
    mask = mask.to(values.dtype)
    old = values.detach() if old_values is None else old_values
    token_loss, clipped = value_token_loss(values, old, returns, clip=cfg.value_clip)
    loss = aggregate(token_loss, mask, cfg.aggregation, denominator)
    sums = {
        "tokens": float(mask.sum()),
        "vf_loss": float(loss.detach()),
        "vf_clipped": float((clipped.to(mask.dtype) * mask).sum()),
        "values": float((values.detach() * mask).sum()),
    }
    return loss, sums
