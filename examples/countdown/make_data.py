"""Generates the default example's countdown puzzles locally (no downloads) as train/eval jsonl files.

A puzzle gives `count` numbers and a target; the answer is an arithmetic expression that uses every
number exactly once (operators from `ops`, standard precedence) and evaluates to the target. Each row
holds the user prompt, the verifier spec (`answer`, read by `examples.countdown.reward`) and one
reference solution (`solution`, the supervised warm-up's target). Eval puzzles never share
(numbers, target) with train puzzles. Called by the scheduler's data preparation of the example
workflow, by tests and by bench/e2e/recipe_probe.py.

CLI: `python -m examples.countdown.make_data OUT_DIR [--seed 0] [--n-train 4000] [--n-eval 256]`
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

from examples.dataset_files import write_train_and_eval
from meshrl.common.errors import InvalidArgument

ALLOWED_OPS = "+-*"


@dataclass(frozen=True)
class PuzzleSpec:
    """The shape of the puzzles: how many numbers, their range, the operators and the target range."""

    count: int = 3
    min_num: int = 1
    max_num: int = 9
    ops: str = "+-"
    min_target: int = 1
    max_target: int = 99

    def validate(self) -> None:
        if not 2 <= self.count <= 6:
            raise InvalidArgument(f"puzzle count={self.count} is out of range; use 2..6 numbers per puzzle")
        if not 0 <= self.min_num <= self.max_num:
            raise InvalidArgument(f"puzzle numbers range [{self.min_num}, {self.max_num}] is empty or negative")
        if not self.ops or any(op not in ALLOWED_OPS for op in self.ops):
            raise InvalidArgument(f"puzzle ops={self.ops!r} must be a non-empty subset of {ALLOWED_OPS!r}")
        if self.min_target > self.max_target:
            raise InvalidArgument(f"puzzle target range [{self.min_target}, {self.max_target}] is empty")


@dataclass(frozen=True)
class Puzzle:
    numbers: tuple[int, ...]
    target: int
    solution: str

    @property
    def key(self) -> tuple[tuple[int, ...], int]:
        """Identity used to keep eval puzzles out of the train set (numbers order does not matter)."""
        return tuple(sorted(self.numbers)), self.target


def format_prompt(numbers: tuple[int, ...], target: int) -> str:
    """The user message of a puzzle, e.g. 'Make 16 with 3 7 5'."""
    return f"Make {target} with {' '.join(str(n) for n in numbers)}"


def format_answer(numbers: tuple[int, ...], target: int) -> str:
    """The verifier spec stored under the answer key, e.g. 'target:16 numbers:3,7,5'."""
    return f"target:{target} numbers:{','.join(str(n) for n in numbers)}"


def _evaluate(tokens: list[int | str]) -> int:
    """Evaluates a flat `n op n op n ...` list with * binding tighter than + and -."""
    terms: list[int] = []
    signs: list[int] = [1]
    acc = int(tokens[0])
    for op, value in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            acc *= int(value)
        else:
            terms.append(acc)
            signs.append(1 if op == "+" else -1)
            acc = int(value)
    terms.append(acc)
    return sum(s * t for s, t in zip(signs, terms))


def sample_puzzle(rng: random.Random, spec: PuzzleSpec) -> Puzzle:
    """Draws numbers, a random order and operators; retries until the value lies in the target range."""
    for _ in range(10_000):
        numbers = tuple(rng.randint(spec.min_num, spec.max_num) for _ in range(spec.count))
        order = list(numbers)
        rng.shuffle(order)
        ops = [rng.choice(spec.ops) for _ in range(spec.count - 1)]
        tokens: list[int | str] = [order[0]]
        for op, value in zip(ops, order[1:]):
            tokens += [op, value]
        target = _evaluate(tokens)
        if spec.min_target <= target <= spec.max_target:
            return Puzzle(numbers=numbers, target=target, solution="".join(str(t) for t in tokens))
    raise InvalidArgument(f"no puzzle with a target in [{spec.min_target}, {spec.max_target}] found for {spec}")


def generate(seed: int, n_train: int, n_eval: int, spec: PuzzleSpec | None = None) -> tuple[list[Puzzle], list[Puzzle]]:
    """Deterministic train and eval puzzles for `seed`; eval keys are unique and absent from train."""
    spec = spec or PuzzleSpec()
    spec.validate()
    if n_train < 1 or n_eval < 0:
        raise InvalidArgument(f"n_train={n_train} must be >= 1 and n_eval={n_eval} >= 0")
    rng = random.Random(seed)
    eval_set: list[Puzzle] = []
    eval_keys: set[tuple[tuple[int, ...], int]] = set()
    attempts = 0
    while len(eval_set) < n_eval:
        attempts += 1
        if attempts > 100 * (n_eval + 10):
            raise InvalidArgument(f"only {len(eval_set)} distinct eval puzzles exist for {spec}; lower n_eval")
        puzzle = sample_puzzle(rng, spec)
        if puzzle.key not in eval_keys:
            eval_keys.add(puzzle.key)
            eval_set.append(puzzle)
    train_set: list[Puzzle] = []
    attempts = 0
    while len(train_set) < n_train:
        attempts += 1
        if attempts > 100 * (n_train + 10):
            raise InvalidArgument(f"eval puzzles cover the puzzle space of {spec}; lower n_eval or widen the spec")
        puzzle = sample_puzzle(rng, spec)
        if puzzle.key not in eval_keys:
            train_set.append(puzzle)
    return train_set, eval_set


def to_row(puzzle: Puzzle) -> dict[str, str]:
    return {
        "prompt": format_prompt(puzzle.numbers, puzzle.target),
        "answer": format_answer(puzzle.numbers, puzzle.target),
        "solution": puzzle.solution,
    }


def write_dataset(
    out_dir: str | Path, seed: int = 0, n_train: int = 4000, n_eval: int = 256, spec: PuzzleSpec | None = None
) -> tuple[Path, Path]:
    """Writes OUT_DIR/train.jsonl and OUT_DIR/eval.jsonl (keys: prompt, answer, solution); returns both paths.

    The same arguments always produce byte-identical files.
    """
    train, evals = generate(seed, n_train, n_eval, spec)
    return write_train_and_eval(out_dir, map(to_row, train), map(to_row, evals))


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.countdown.make_data", description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=4000)
    parser.add_argument("--n-eval", type=int, default=256)
    parser.add_argument("--count", type=int, default=PuzzleSpec.count)
    parser.add_argument("--max-num", type=int, default=PuzzleSpec.max_num)
    parser.add_argument("--ops", default=PuzzleSpec.ops)
    args = parser.parse_args(argv)
    spec = PuzzleSpec(count=args.count, max_num=args.max_num, ops=args.ops)
    for path in write_dataset(args.out_dir, args.seed, args.n_train, args.n_eval, spec):
        print(path)


if __name__ == "__main__":
    _main()
