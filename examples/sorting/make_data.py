"""Generates the sorting example's lists locally (no downloads) as train/eval jsonl files.

A list holds `min_len`..`max_len` digits (0-9, repeats allowed); the answer is the same digits in ascending
order, written out one per token with spaces between them ("Sort 50838" -> "0 3 5 8 8"), so a response runs
to 11-19 tokens at the default lengths (6-10 digits), 20 with its end of turn. Each row holds the user prompt, the list (`answer`, read by
`examples.sorting.reward`) and the sorted list (`solution`, the supervised warm-up's target). Eval lists never
occur in train (as multisets of digits). Called by the scheduler's data preparation of the example workflow
and by tests.

CLI: `python -m examples.sorting.make_data OUT_DIR [--seed 0] [--n-train 4000] [--n-eval 256]`
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

from examples.dataset_files import write_train_and_eval
from meshrl.common.errors import InvalidArgument


@dataclass(frozen=True)
class ListSpec:
    """How long the lists are (digits per list, both ends included)."""

    min_len: int = 6
    max_len: int = 10

    def validate(self) -> None:
        if not 2 <= self.min_len <= self.max_len <= 40:
            raise InvalidArgument(
                f"list lengths [{self.min_len}, {self.max_len}] must satisfy 2 <= min_len <= max_len <= 40"
            )


def format_prompt(digits: tuple[int, ...]) -> str:
    """The user message of a list, e.g. 'Sort 50838': the digits without spaces, a token each, so that the prompt
    is short beside the response (the trainer reads both; generation decodes only the response)."""
    return "Sort " + "".join(str(d) for d in digits)


def format_digits(digits: tuple[int, ...] | list[int]) -> str:
    """Digits written one per token with spaces between them: the answer spec and the solution's form."""
    return " ".join(str(d) for d in digits)


def sample_list(rng: random.Random, spec: ListSpec) -> tuple[int, ...]:
    length = rng.randint(spec.min_len, spec.max_len)
    return tuple(rng.randint(0, 9) for _ in range(length))


def generate(seed: int, n_train: int, n_eval: int, spec: ListSpec | None = None) -> tuple[list, list]:
    """Deterministic train and eval lists for `seed`; eval multisets are unique and absent from train."""
    spec = spec or ListSpec()
    spec.validate()
    if n_train < 1 or n_eval < 0:
        raise InvalidArgument(f"n_train={n_train} must be >= 1 and n_eval={n_eval} >= 0")
    rng = random.Random(seed)
    eval_set: list[tuple[int, ...]] = []
    eval_keys: set[tuple[int, ...]] = set()
    while len(eval_set) < n_eval:
        digits = sample_list(rng, spec)
        if tuple(sorted(digits)) not in eval_keys:
            eval_keys.add(tuple(sorted(digits)))
            eval_set.append(digits)
    train_set: list[tuple[int, ...]] = []
    while len(train_set) < n_train:
        digits = sample_list(rng, spec)
        if tuple(sorted(digits)) not in eval_keys:
            train_set.append(digits)
    return train_set, eval_set


def to_row(digits: tuple[int, ...]) -> dict[str, str]:
    return {"prompt": format_prompt(digits), "answer": format_digits(digits), "solution": format_digits(sorted(digits))}


def write_dataset(
    out_dir: str | Path, seed: int = 0, n_train: int = 4000, n_eval: int = 256, spec: ListSpec | None = None
) -> tuple[Path, Path]:
    """Writes OUT_DIR/train.jsonl and OUT_DIR/eval.jsonl (keys: prompt, answer, solution); returns both paths.

    The same arguments always produce byte-identical files.
    """
    train, evals = generate(seed, n_train, n_eval, spec)
    return write_train_and_eval(out_dir, map(to_row, train), map(to_row, evals))


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.sorting.make_data", description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=4000)
    parser.add_argument("--n-eval", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=ListSpec.min_len)
    parser.add_argument("--max-len", type=int, default=ListSpec.max_len)
    args = parser.parse_args(argv)
    spec = ListSpec(min_len=args.min_len, max_len=args.max_len)
    for path in write_dataset(args.out_dir, args.seed, args.n_train, args.n_eval, spec):
        print(path)


if __name__ == "__main__":
    _main()
