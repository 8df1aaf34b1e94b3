"""The sorting example's reward, with partial credit: 1.0 for the exact sorted list; otherwise half the longest
common subsequence of the response's digits and the sorted list over the longer of the two lengths (a digit left
out, added or wrong costs about one position's share; position by position, one left out would cost every
position after it). The gap between an exact answer and the best near miss (1.0 against at most 0.5) keeps the
policy aiming at the whole list: with the share alone it settled for near misses, its sampled reward rising while
greedy exact answers fell. A response that is not digits separated by single spaces scores 0.

Called by the scheduler's reward node (`examples.sorting.reward:score`) and the evaluation, whose accuracy is the
share of greedy responses that score 1.0.
"""

from __future__ import annotations

import re

from meshrl.common.errors import InvalidArgument

_DIGITS_RE = re.compile(r"^\d( \d)*$")
_ANSWER_RE = re.compile(r"^\d( \d)*$")


def parse_answer(answer: str) -> list[int]:
    """'5 0 8 3 8' -> [5, 0, 8, 3, 8]."""
    if _ANSWER_RE.match(answer) is None:
        raise InvalidArgument(
            f"sorting answer {answer!r} is not digits separated by single spaces; write it with examples.sorting.make_data"
        )
    return [int(x) for x in answer.split(" ")]


def common_subsequence(a: list[int], b: list[int]) -> int:
    """Length of the longest common subsequence of a and b."""
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal = 0
        for j, y in enumerate(b):
            diagonal, row[j + 1] = row[j + 1], diagonal + 1 if x == y else max(row[j + 1], row[j])
    return row[-1]


NEAR_MISS = 0.5  # the most a response that is not the exact sorted list scores


def score_one(response: str, answer: str) -> float:
    """1.0 for the sorted list, else NEAR_MISS x the common subsequence's share of the longer length."""
    target = sorted(parse_answer(answer))
    text = response.strip()
    if _DIGITS_RE.match(text) is None:
        return 0.0
    got = [int(x) for x in text.split(" ")]
    if got == target:
        return 1.0
    return NEAR_MISS * common_subsequence(got, target) / max(len(got), len(target))


def score(prompts: list[str], responses: list[str], answers: list[str]) -> list[float]:
    """Rewards for a batch (prompts are not needed: each answer carries the list)."""
    if len(responses) != len(answers) or (prompts and len(prompts) != len(responses)):
        raise InvalidArgument(
            f"reward batch sizes differ: {len(prompts)} prompts, {len(responses)} responses, {len(answers)} answers"
        )
    return [score_one(r, a) for r, a in zip(responses, answers)]
