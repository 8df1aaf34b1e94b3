"""The guess-the-number example's environment and data: a secret integer in 1..15, the model guesses, the
environment answers "higher" or "lower", at most 4 guesses (enough for a binary search of 15 numbers).

    user:      guess 1-15
    assistant: 8
    user:      higher                    (an environment turn, masked out of the loss)
    assistant: 12
    user:      lower
    assistant: 10                        (right: reward 1 and the episode ends)

A turn that is not a number in range is answered "a number from 1 to 15". A wrong guess that the replies so
far allow (inside what is still possible) earns 0.1, a guess they rule out 0: the reward says how to use the
feedback before the secret is ever found. Success (reward >= 1) is finding the secret within the episode's
turns (the workflow's `max_turns`). Named by the workflow's ROLLOUT node
(`executable_ref: examples.guess_number.env:GuessNumberEnv`); `write_dataset` is the job's `data.generator`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.environments import Environment, StepResult, integer_answer

LOW, HIGH = 1, 15
PROMPT = f"guess {LOW}-{HIGH}"


CONSISTENT_REWARD = 0.1  # a wrong guess that the replies so far allow: at most 0.3 an episode, so success is reward 1


class GuessNumberEnv(Environment):
    """One episode; `low`..`high` is what the replies so far leave possible."""

    def reset(self, prompt: str, answer: str) -> str:
        self.secret = integer_answer(answer, "guess-number")
        self.low, self.high = LOW, HIGH
        return prompt

    def step(self, turn: str) -> StepResult:
        text = turn.strip()
        if not text.isdigit() or not LOW <= int(text) <= HIGH:
            return StepResult(f"a number from {LOW} to {HIGH}")
        guess = int(text)
        if guess == self.secret:
            return StepResult("", reward=1.0, done=True)
        consistent = self.low <= guess <= self.high
        if guess < self.secret:
            self.low = max(self.low, guess + 1)
        else:
            self.high = min(self.high, guess - 1)
        return StepResult("higher" if guess < self.secret else "lower", reward=CONSISTENT_REWARD if consistent else 0.0)


def write_dataset(out_dir: str | Path, seed: int = 0, n_train: int = 3000, n_eval: int = 150) -> tuple[Path, Path]:
    """OUT_DIR/train.jsonl and eval.jsonl: rows {prompt: "guess 1-15", answer: secret, solution: a first guess}.

    Secrets are uniform (eval: every secret n_eval / 15 times, so success is exact over the secrets). The
    solution, the warm-up's one-turn target, is a uniformly random number in range, unrelated to the secret:
    the warm-up teaches the format of a guess, never how to use feedback.
    """
    if n_eval % (HIGH - LOW + 1):
        raise InvalidArgument(f"n_eval = {n_eval} must be a multiple of {HIGH - LOW + 1} (each secret equally often)")
    rng = random.Random(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train = [rng.randint(LOW, HIGH) for _ in range(n_train)]
    evals = [LOW + i % (HIGH - LOW + 1) for i in range(n_eval)]
    paths = (out / "train.jsonl", out / "eval.jsonl")
    for path, secrets in zip(paths, (train, evals)):
        rows = [{"prompt": PROMPT, "answer": str(s), "solution": str(rng.randint(LOW, HIGH))} for s in secrets]
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return paths
