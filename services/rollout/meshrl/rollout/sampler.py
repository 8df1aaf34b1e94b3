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


def _truncate(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Masks (to -inf) what top-k / top-p remove from one row of temperature-scaled logits [V]."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first token is always kept).
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> tuple[list[int], list[float]]:
    """logits [B, V] fp32 → (token per row, its log-prob per row)."""
    temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=logits.device)
    scaled = logits / temps[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)
    tokens: list[int] = []
    greedy_rows = [i for i, p in enumerate(params) if p.greedy]
    chosen = torch.empty(len(params), dtype=torch.long, device=logits.device)
    if greedy_rows:
        idx = torch.tensor(greedy_rows, device=logits.device)
        chosen[idx] = torch.argmax(logits[idx], dim=-1)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = _truncate(scaled[i], p.top_k, p.top_p)
        probs = torch.softmax(row, dim=-1)
        chosen[i] = torch.multinomial(probs, 1, generator=generators[i])[0]
    picked = logprobs.gather(1, chosen[:, None])[:, 0]
    tokens = chosen.tolist()
    return tokens, picked.tolist()
