"""The vectorized sampler's counter-based noise: exact 32-bit arithmetic, batch-independent draws, and
samples distributed as softmax(logits / temperature) (meshrl.rollout.counter_rng, meshrl.rollout.sampler)."""

from __future__ import annotations

import random

import pytest
import torch

from meshrl.rollout.counter_rng import _mul32, mix32, row_uniforms
from meshrl.rollout.sampler import sample, sample_key
from meshrl.rollout.types import SamplingParams


def _mix32_ref(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_the_int64_arithmetic_is_exact_32_bit_arithmetic():
    rng = random.Random(0)
    xs = [0, 1, 0xFFFFFFFF, 0x80000000, *[rng.getrandbits(32) for _ in range(2000)]]
    t = torch.tensor(xs, dtype=torch.int64)
    for c in (0x7FEB352D, 0x846CA68B, 0xFFFFFFFF, 0x9E3779B9):
        assert _mul32(t, c).tolist() == [(x * c) & 0xFFFFFFFF for x in xs]
    assert mix32(t).tolist() == [_mix32_ref(x) for x in xs]


def test_a_rows_draw_depends_on_its_key_and_position_only():
    keys = torch.tensor([5, 2**62 + 7, 5, 123456789, 2**63 - 1], dtype=torch.int64)
    pos = torch.tensor([0, 3, 1, 0, 11], dtype=torch.int64)
    together = row_uniforms(keys, pos)
    for i in range(5):
        assert row_uniforms(keys[i : i + 1], pos[i : i + 1])[0] == together[i]
    assert together[0] != together[2]  # same key, next position
    assert 0 < float(together.min()) and float(together.max()) < 1


def test_the_uniforms_are_uniform_over_keys_and_over_positions():
    for keys, pos in (
        (torch.arange(200000, dtype=torch.int64) * 7919, torch.zeros(200000, dtype=torch.int64)),
        (torch.full((200000,), 3, dtype=torch.int64), torch.arange(200000, dtype=torch.int64)),
    ):
        u = row_uniforms(keys, pos)
        counts = torch.histc(u.float(), bins=20, min=0, max=1)
        expected = u.numel() / 20
        assert float(((counts - expected) ** 2 / expected).sum()) < 43.8  # chi-square, 19 dof, p = 1e-4
        assert abs(float(u.mean()) - 0.5) < 0.003
        assert len(set(u.tolist())) == u.numel()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_samples_follow_the_softmax(temperature):
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0])
    n = 20000
    params = [SamplingParams(temperature=temperature, seed=s) for s in range(n)]
    keys = [sample_key(p) for p in params]
    tokens, logprobs = sample(logits.expand(n, -1).clone(), params, keys, [0] * n)
    probs = torch.softmax(logits / temperature, dim=-1)
    freq = torch.bincount(torch.tensor(tokens), minlength=5).double() / n
    assert torch.allclose(freq, probs.double(), atol=4 * (0.25 / n) ** 0.5)
    assert logprobs[0] == pytest.approx(float(torch.log(probs[tokens[0]])), abs=1e-5)


def test_top_k_and_top_p_keep_their_tokens_only():
    logits = torch.tensor([3.0, 2.9, 0.0, -1.0])
    n = 2000
    params = [SamplingParams(temperature=1.0, top_k=2, seed=s) for s in range(n)]
    tokens, _ = sample(logits.expand(n, -1).clone(), params, [p.seed for p in params], [0] * n)
    assert set(tokens) == {0, 1}
    params = [SamplingParams(temperature=1.0, top_p=0.01, seed=s) for s in range(50)]
    tokens, _ = sample(logits.expand(50, -1).clone(), params, [p.seed for p in params], [0] * 50)
    assert set(tokens) == {0}


def test_a_seeded_draw_does_not_depend_on_the_batch_around_it():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g)
    params = [SamplingParams(temperature=1.0, seed=100 + i) for i in range(6)]
    params[2] = SamplingParams(temperature=0)  # a greedy row beside them
    keys, pos = [sample_key(p) for p in params], [0, 4, 1, 7, 2, 9]
    together, _ = sample(logits, params, keys, pos)
    for i in range(6):
        alone, _ = sample(logits[i : i + 1], params[i : i + 1], keys[i : i + 1], pos[i : i + 1])
        assert alone[0] == together[i]
    assert together[2] == int(torch.argmax(logits[2]))


def test_unseeded_requests_get_distinct_random_keys():
    keys = {sample_key(SamplingParams(temperature=1.0)) for _ in range(100)}
    assert len(keys) == 100 and all(0 <= k < 2**63 for k in keys)
    assert sample_key(SamplingParams(temperature=1.0, seed=42)) == 42
