"""The countdown generator: deterministic files, well-formed rows, solvable puzzles, eval disjoint from train."""

import json

import pytest

from examples import dataset_files
from examples.countdown import make_data, reward
from meshrl.common.errors import InvalidArgument


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_same_seed_gives_identical_files(tmp_path):
    a = make_data.write_dataset(tmp_path / "a", seed=3, n_train=200, n_eval=40)
    b = make_data.write_dataset(tmp_path / "b", seed=3, n_train=200, n_eval=40)
    for pa, pb in zip(a, b):
        assert pa.read_bytes() == pb.read_bytes()
    c = make_data.write_dataset(tmp_path / "c", seed=4, n_train=200, n_eval=40)
    assert c[0].read_bytes() != a[0].read_bytes()


def test_rows_have_keys_sizes_and_correct_solutions(tmp_path):
    train_path, eval_path = make_data.write_dataset(tmp_path, seed=0, n_train=300, n_eval=50)
    assert (train_path.name, eval_path.name) == (dataset_files.TRAIN_FILE, dataset_files.EVAL_FILE)
    train, evals = _rows(train_path), _rows(eval_path)
    assert len(train) == 300 and len(evals) == 50
    for row in train + evals:
        assert set(row) == {"prompt", "answer", "solution"}
        target, numbers = reward.parse_answer(row["answer"])
        assert row["prompt"] == make_data.format_prompt(tuple(numbers), target)
        assert reward.is_correct(row["solution"], row["answer"]), row
        assert len(numbers) == 3 and all(1 <= n <= 9 for n in numbers)
        assert 1 <= target <= 99


def test_eval_puzzles_are_unique_and_never_in_train():
    train, evals = make_data.generate(seed=1, n_train=500, n_eval=100)
    eval_keys = [p.key for p in evals]
    assert len(set(eval_keys)) == len(eval_keys)
    assert not set(eval_keys) & {p.key for p in train}


def test_spec_controls_the_puzzles():
    spec = make_data.PuzzleSpec(count=4, max_num=20, ops="+-*", max_target=200)
    train, _ = make_data.generate(seed=0, n_train=200, n_eval=10, spec=spec)
    assert all(len(p.numbers) == 4 and max(p.numbers) <= 20 and 1 <= p.target <= 200 for p in train)
    assert any("*" in p.solution for p in train)


@pytest.mark.parametrize(
    "spec",
    [make_data.PuzzleSpec(count=1), make_data.PuzzleSpec(ops="+/"), make_data.PuzzleSpec(min_num=5, max_num=2)],
)
def test_bad_specs_are_refused(spec):
    with pytest.raises(InvalidArgument):
        make_data.generate(seed=0, n_train=10, n_eval=2, spec=spec)


def test_too_many_eval_puzzles_for_the_space_is_refused():
    tiny = make_data.PuzzleSpec(count=2, max_num=2, ops="+")
    with pytest.raises(InvalidArgument, match="lower n_eval"):
        make_data.generate(seed=0, n_train=10, n_eval=50, spec=tiny)
