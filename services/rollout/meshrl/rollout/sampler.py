"""Picks the next token of every row from its logits, with per-row sampling parameters.

Called by the continuous batcher after each forward pass. The returned log-prob of a token is
log_softmax(logits / temperature)[token] over the full vocabulary (raw logits when greedy), i.e.
before top-k / top-p truncation: what a trainer's teacher-forced pass at the same temperature gives.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from meshrl.rollout.types import SamplingParams


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A per-request generator when a seed is given (reproducible samples), else None (global RNG)."""
    if params.greedy or params.seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(int(params.seed) & 0x7FFF_FFFF_FFFF_FFFF)
    return gen


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


def _seeded_picks(probs: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One token per row of probs [B, V], row b drawn with generators[b]: exactly what
    `torch.multinomial(probs[b], 1, generator=generators[b])` picks (its one-sample path is argmax(p / q),
    q ~ Exp(1) drawn from the generator), with one noise draw per row and the rest batched, instead of a
    whole multinomial call (with its checks) and a tensor write per row and token."""
    noise = torch.empty_like(probs)
    for row, gen in zip(noise, generators):
        row.exponential_(generator=gen)
    return torch.argmax(probs / noise, dim=-1)


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> tuple[list[int], list[float]]:
    """logits [B, V] fp32 → (token per row, its log-prob per row)."""
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
        probs = torch.softmax(rows, dim=-1)
        free = [j for j, i in enumerate(sampled) if generators[i] is None]
        if free:
            picks = torch.multinomial(probs[free], 1)[:, 0]
            chosen[idx[free]] = picks
        seeded = [j for j, i in enumerate(sampled) if generators[i] is not None]
        if seeded:  # each from its own generator: reproducible whatever the batch
            chosen[idx[seeded]] = _seeded_picks(probs[seeded], [generators[sampled[j]] for j in seeded])
    picked = logprobs.gather(1, chosen[:, None])[:, 0]
    return chosen.tolist(), picked.tolist()
