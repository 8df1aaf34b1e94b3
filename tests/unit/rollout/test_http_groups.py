"""Which samples of a batch share one server request (http_groups.sample_groups): same prompt and sampling,
at most `limit` together, and where the engine honours seeds only seeds that run on by one (vLLM seeds sample k
of a request with its seed + k)."""

from __future__ import annotations

from meshrl.rollout.http_groups import sample_groups
from meshrl.rollout.types import GenerationRequest, SamplingParams


def req(prompt, seed=None, temperature=1.0):
    return GenerationRequest(prompt, SamplingParams(max_tokens=4, seed=seed, temperature=temperature))


def test_samples_of_one_prompt_and_sampling_group_in_order_of_first_appearance():
    batch = [req([1]), req([2]), req([1]), req([1], temperature=0.5), req([2])]
    assert sample_groups(batch, seeds_sent=True, limit=8) == [[0, 2], [1, 4], [3]]


def test_groups_hold_at_most_the_limit():
    assert sample_groups([req([1])] * 5, seeds_sent=True, limit=2) == [[0, 1], [2, 3], [4]]


def test_seeds_must_run_on_by_one_where_the_engine_honours_them():
    batch = [req([1], 10), req([1], 11), req([1], 13), req([1], 14), req([1]), req([1], 12)]
    assert sample_groups(batch, seeds_sent=True, limit=8) == [[0, 1], [2, 3], [4], [5]]  # one open group a key
    assert sample_groups(batch, seeds_sent=False, limit=8) == [[0, 1, 2, 3, 4, 5]]


def test_greedy_samples_never_share_a_request():
    """vLLM refuses n > 1 at temperature 0 (recorded: 'n must be 1 when using greedy sampling, got 3')."""
    batch = [req([1], temperature=0.0)] * 3
    assert sample_groups(batch, seeds_sent=False, limit=8) == [[0], [1], [2]]
