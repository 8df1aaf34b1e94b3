"""The hint-and-solve example's user code: two agents that generate in turn. The `hinter` reads a sum and
writes a short hint; the `solver` reads the sum and that hint and answers. Each is rewarded by its own rule.

`hand_over` is the COMPUTE node between them (one solver prompt per hinter sample, token for token: the
hinter's prompt and response, never decoded and re-encoded); `hint_reward` is the hinter's rule and
`solve_reward` the solver's. `write_dataset` is the job's `data.generator`.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from meshrl.common import batch_schema as S
from meshrl.common.codec import Batch, Ragged

_NUMBER = re.compile(r"\d+")


def hand_over(batch: Batch, config: dict) -> dict[str, Ragged]:
    """The solver's prompts: each hinter sample's prompt ++ response ids, with the task's answer."""
    prompts, responses = batch[S.PROMPT_IDS], batch[S.RESPONSE_IDS]
    rows = [np.concatenate([prompts.row(i), responses.row(i)]) for i in range(len(prompts))]
    return {S.PROMPT_IDS: Ragged.from_rows(rows, np.int32), S.ANSWER: batch[S.ANSWER]}


def hint_reward(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    """1.0 for a hint that names the sum's result, 0.2 for one that names some other number, else 0."""
    return [
        1.0 if answer in _NUMBER.findall(hint) else 0.2 if _NUMBER.search(hint) else 0.0
        for hint, answer in zip(responses, answers, strict=True)
    ]


def solve_reward(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    """1.0 when the answer's first number is the sum's result, 0.2 when it starts with another number, else 0."""
    firsts = [_NUMBER.findall(r)[:1] for r in responses]
    return [1.0 if first == [answer] else 0.2 if first else 0.0 for first, answer in zip(firsts, answers, strict=True)]


def write_dataset(out_dir: str | Path, seed: int = 0, n_train: int = 512) -> tuple[Path]:
    """OUT_DIR/train.jsonl: rows {prompt: "a+b=", answer: str(a + b)} with one-digit a and b."""
    rng = random.Random(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for _ in range(n_train):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    path = out / "train.jsonl"
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return (path,)
