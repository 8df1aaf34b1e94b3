"""Picks the next token of every row from its logits, with per-row sampling parameters, in one vectorized pass.

Called by the continuous batcher after each forward pass. Every row carries a 64-bit key (its request's seed,
or a random one when the request has none) and the position of the token being drawn; the draw inverts the
row's cumulative distribution at a counter-based uniform (meshrl.rollout.counter_rng), so a seeded request gives the same
tokens whatever batch it decodes in. The returned log-prob of a token is log_softmax(logits / temperature)
[token] over the full vocabulary (raw logits when greedy), i.e. before top-k / top-p truncation: what a
trainer's teacher-forced pass at the same temperature gives.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import torch

from meshrl.rollout.counter_rng import row_uniforms
from meshrl.rollout.types import SamplingParams

KEY_MASK = 0x7FFF_FFFF_FFFF_FFFF


def sample_key(params: SamplingParams) -> int:
    """A request's noise key: its seed (reproducible samples), else a fresh random one."""
    if params.seed is not None:
        return int(params.seed) & KEY_MASK
    return secrets.randbits(63)


def _truncated(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Masks (to -inf) what per-row top-k ([B] long, 0 = off) and top-p ([B], 1 = off) remove from [B, V]."""
    vocab = scaled.shape[-1]
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    drop = rank >= k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    # Drop a token when the mass before it already reaches top_p (the first token is always kept).
    drop |= (torch.cumsum(probs, dim=-1) - probs) >= top_p[:, None]
    return scaled.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], keys: Sequence[int], positions: Sequence[int]
) -> tuple[list[int], list[float]]:
    """logits [B, V] fp32, each row's key and the response position it draws → (token per row, its log-prob)."""
    device = logits.device
    temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=device)
    scaled = logits / temps[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)
    chosen = torch.argmax(logits, dim=-1)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        idx = torch.tensor(sampled, device=device)
        top_k = torch.tensor([params[i].top_k for i in sampled], device=device)
        top_p = torch.tensor([params[i].top_p for i in sampled], device=device)
        rows = scaled[idx]
        if bool((top_k > 0).any()) or bool((top_p < 1).any()):
            rows = _truncated(rows, top_k, top_p)
        row_keys = torch.tensor([keys[i] for i in sampled], dtype=torch.int64, device=device)
        row_pos = torch.tensor([positions[i] for i in sampled], dtype=torch.int64, device=device)
        # Inverse CDF: the first token whose cumulative probability passes the row's uniform (a removed
        # token adds no mass, so it is never picked).
        cdf = torch.cumsum(torch.softmax(rows.to(torch.float64), dim=-1), dim=-1)
        target = row_uniforms(row_keys, row_pos)[:, None] * cdf[:, -1:]
        picks = torch.searchsorted(cdf, target, right=True)[:, 0]
        chosen[idx] = picks.clamp(max=rows.shape[-1] - 1)
    picked = logprobs.gather(1, chosen[:, None])[:, 0]
    return chosen.tolist(), picked.tolist()
