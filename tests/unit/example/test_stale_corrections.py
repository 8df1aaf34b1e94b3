"""The screened corrections of bench/e2e/stale_corrections.py on hand-made log-ratios: the low side of two-sided
masking, sequence masking by the geometric-mean ratio, and the second-moment trust region dropping the largest
squared log-ratios first until the rest are within the cap; padding never stays; the negative-advantage cap
truncates those tokens' weights alone."""

import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "e2e"))
from stale_corrections import cap_negative, screened_mask  # noqa: E402

sys.path.remove(str(ROOT / "bench" / "e2e"))

OLD = torch.tensor([[0.0, -1.0, -0.5], [-0.2, 0.0, 0.0]])
BEHAVIOUR = torch.tensor([[-0.1, -0.2, -0.5], [-0.2, 0.0, 0.0]])  # log-ratios 0.1, -0.8, 0 | 0 (then padding)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_nothing_screened_keeps_every_response_token():
    assert torch.equal(screened_mask(OLD, BEHAVIOUR, MASK), MASK)


def test_tokens_below_the_low_bound_leave():
    kept = screened_mask(OLD, BEHAVIOUR, MASK, mis_low=0.5)  # exp(-0.8) = 0.45 < 0.5
    assert torch.equal(kept, torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))


def test_a_sequence_off_by_more_than_the_bound_leaves_whole():
    kept = screened_mask(OLD, BEHAVIOUR, MASK, seq_mask=1.1)  # row 0: mean log-ratio -0.233, |.| > log 1.1
    assert torch.equal(kept, torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert torch.equal(screened_mask(OLD, BEHAVIOUR, MASK, seq_mask=math.exp(0.3)), MASK)


def test_the_second_moment_region_drops_the_largest_squares_first():
    # squares 0.01, 0.64, 0, 0: mean 0.1625 > 0.04; without the 0.64 the mean is 0.0033
    kept = screened_mask(OLD, BEHAVIOUR, MASK, m2_cap=0.04)
    assert torch.equal(kept, torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
    assert torch.equal(screened_mask(OLD, BEHAVIOUR, MASK, m2_cap=0.2), MASK)  # already within


def test_the_negative_cap_truncates_only_negative_advantage_tokens():
    weights = torch.tensor([[0.5, 1.5, 3.0], [2.0, 0.8, 1.0]])
    advantages = torch.tensor([[1.0], [-1.0]])  # per sequence, broadcast over its tokens
    capped = cap_negative(weights, advantages, 1.0)
    assert torch.equal(capped, torch.tensor([[0.5, 1.5, 3.0], [1.0, 0.8, 1.0]]))
    assert torch.equal(cap_negative(weights, advantages, 0.0), weights)
