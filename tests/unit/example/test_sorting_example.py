"""The sorting example's data and reward: lists of 6-10 digits, held-out lists kept out of train, byte-identical
files per seed; 1.0 for the exact sorted list, half the common-subsequence share for a near miss, 0 for anything
that is not digits separated by single spaces."""

import json

import pytest

from examples.sorting import make_data, reward
from meshrl.common.errors import InvalidArgument


def test_rows_hold_the_prompt_the_list_and_its_sorted_form():
    train, evals = make_data.generate(seed=3, n_train=200, n_eval=50)
    spec = make_data.ListSpec()
    for digits in train + evals:
        assert spec.min_len <= len(digits) <= spec.max_len
    row = make_data.to_row((5, 0, 8, 3, 8))
    assert row == {"prompt": "Sort 50838", "answer": "5 0 8 3 8", "solution": "0 3 5 8 8"}
    assert reward.score_one(row["solution"], row["answer"]) == 1.0
    eval_keys = {tuple(sorted(d)) for d in evals}
    assert len(eval_keys) == 50 and not eval_keys & {tuple(sorted(d)) for d in train}


def test_the_same_seed_writes_the_same_files(tmp_path):
    a = make_data.write_dataset(tmp_path / "a", seed=1, n_train=30, n_eval=5)
    b = make_data.write_dataset(tmp_path / "b", seed=1, n_train=30, n_eval=5)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    rows = [json.loads(line) for line in a[0].read_text().splitlines()]
    assert len(rows) == 30 and set(rows[0]) == {"prompt", "answer", "solution"}


def test_a_list_spec_out_of_range_is_refused():
    with pytest.raises(InvalidArgument, match="list lengths"):
        make_data.ListSpec(min_len=5, max_len=3).validate()


@pytest.mark.parametrize(
    "response, expected",
    [
        ("0 3 5 8 8", 1.0),
        (" 0 3 5 8 8 ", 1.0),
        ("0 3 5 8", 0.5 * 4 / 5),  # a digit left out
        ("0 3 5 5 8 8", 0.5 * 5 / 6),  # a digit added
        ("0 3 5 8 9", 0.5 * 4 / 5),  # a digit wrong
        ("8 8 5 3 0", 0.5 * 2 / 5),  # the list reversed: 8 8 is its longest run in order
        ("03588", 0.0),  # not spaced
        ("0 3 5 8 8 x", 0.0),
        ("", 0.0),
    ],
)
def test_partial_credit(response, expected):
    assert reward.score_one(response, "5 0 8 3 8") == pytest.approx(expected)


def test_common_subsequence_and_batch_checks():
    assert reward.common_subsequence([1, 3, 2], [1, 2, 3]) == 2
    assert reward.common_subsequence([], [1]) == 0
    assert reward.score(["p", "q"], ["1 2", "2 1"], ["2 1", "1 2"]) == [1.0, 0.25]
    with pytest.raises(InvalidArgument, match="batch sizes"):
        reward.score([], ["1"], ["1", "2"])
    with pytest.raises(InvalidArgument, match="digits separated"):
        reward.parse_answer("1,2")
