"""Corrections for stale samples that recipe_probe screens beside the trainer's own (TIS / MIS caps, lag_lr_scale):
which tokens stay in the loss under two-sided token masking, sequence masking and a second-moment trust region
(M2PO), and an importance-weight cap on negative-advantage tokens only. Pure torch over padded [B, T] tensors;
bench/async/README.md has what each measured.
"""

from __future__ import annotations

import math

import torch


def screened_mask(
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    rmask: torch.Tensor,
    *,
    mis_low: float = 0.0,
    seq_mask: float = 0.0,
    m2_cap: float = 0.0,
) -> torch.Tensor:
    """1 where a response token stays in the loss, else 0 (padding 0), [B, T] like `rmask`:
    - mis_low > 0: tokens whose pi_old / pi_behaviour is below it leave (the low side of two-sided masking);
    - seq_mask > 1: a sequence whose geometric-mean ratio lies outside [1 / seq_mask, seq_mask] leaves whole;
    - m2_cap > 0: the tokens of largest squared log-ratio leave, largest first, until the mean of the squares of
      those left is at most m2_cap (a trust region on the second moment, as M2PO)."""
    log_ratio = (old_logp - behaviour_logp) * rmask
    keep = rmask.bool()
    if mis_low:
        keep &= log_ratio >= math.log(mis_low)
    if seq_mask:
        seq = log_ratio.sum(-1, keepdim=True) / rmask.sum(-1, keepdim=True).clamp(min=1.0)
        keep &= seq.abs() <= math.log(seq_mask)
    if m2_cap:
        sq = torch.where(keep, log_ratio.square(), torch.zeros_like(log_ratio)).flatten()
        order = sq.argsort(descending=True)
        n = int(keep.sum())
        tail = sq[order].flip(0).cumsum(0).flip(0)  # the sum of the squares left after masking the top j
        left = (n - torch.arange(len(sq))).clamp(min=1)
        ok = (tail / left <= m2_cap).nonzero()
        drop = int(ok[0]) if len(ok) else n
        flat = keep.flatten().clone()
        flat[order[:drop]] = False
        keep = flat.view_as(keep)
    return keep.to(rmask.dtype)


def cap_negative(weights: torch.Tensor, advantages: torch.Tensor, cap: float) -> torch.Tensor:
    """The importance weights with those of negative-advantage tokens truncated at `cap` (TOPR's asymmetry takes
    1: samples the update pushes down never weigh more than they would on-policy); the rest unchanged, and all of
    them when cap is 0. `advantages` broadcasts against `weights` ([B, 1] per sequence or [B, T])."""
    if not cap:
        return weights
    return torch.where(advantages < 0, weights.clamp(max=cap), weights)
