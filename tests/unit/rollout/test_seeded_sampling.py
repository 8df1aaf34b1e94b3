"""Seeded sampling (per-request generators) in the rollout sampler: the batched draw picks exactly the
tokens that one torch.multinomial call per row with the same generators picks, so a seed gives the same
samples as before the draws were batched, whatever the batch and its mix of seeded and unseeded rows."""

from __future__ import annotations

import torch

from meshrl.rollout.sampler import _truncated, make_generator, sample
from meshrl.rollout.types import SamplingParams


def _generators(seeds):
    return [make_generator(SamplingParams(seed=s), torch.device("cpu")) if s is not None else None for s in seeds]


def test_seeded_rows_pick_what_one_multinomial_call_per_row_picks():
    torch.manual_seed(0)
    logits = torch.randn(16, 300) * 3
    params = [SamplingParams(temperature=0.7, top_p=0.9 if i % 2 else 1.0, seed=100 + i) for i in range(16)]
    ours, reference = _generators([p.seed for p in params]), _generators([p.seed for p in params])
    for _token in range(20):  # the generators advance token by token, as in a decode loop
        picked, logps = sample(logits, params, ours)
        scaled = logits / torch.tensor([p.temperature for p in params])[:, None]
        expected = []
        for i, p in enumerate(params):
            row = scaled[i : i + 1]
            if p.top_p < 1:
                row = _truncated(row, torch.tensor([0]), torch.tensor([p.top_p]))
            expected.append(int(torch.multinomial(torch.softmax(row[0], -1), 1, generator=reference[i])[0]))
        assert picked == expected
        want = torch.log_softmax(scaled, -1).gather(1, torch.tensor(expected)[:, None])[:, 0].tolist()
        assert logps == want


def test_a_seeded_row_picks_the_same_tokens_in_any_batch():
    torch.manual_seed(1)
    logits = torch.randn(6, 50)
    seeded = SamplingParams(temperature=1.0, seed=7)
    alone = [sample(logits[2:3], [seeded], _generators([7]))[0][0] for _ in range(1)]
    mixed = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0), seeded,
             SamplingParams(temperature=1.0, seed=8), SamplingParams(temperature=0.5), SamplingParams(seed=9)]  # fmt: skip
    got, _ = sample(logits, mixed, _generators([p.seed for p in mixed]))
    assert got[2] == alone[0]
    assert got[1] == int(torch.argmax(logits[1]))  # greedy rows stay argmax
