"""Reward functions run by the REWARD COMPUTE node and by evaluation.

A reward function takes `(prompts, responses, answers)` (lists of str of one length) and
returns one float per response. Built-ins: `exact_match`, `math_verify` (the `math-verify`
package), `format_boxed`; anything else is a `package.module:function` reference from a module
the job allows (`job.allowed_modules`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.workflow import resolve_executable

RewardFn = Callable[[Sequence[str], Sequence[str], Sequence[str]], Sequence[float]]
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def _final_answer(text: str) -> str:
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    return text.strip()


def exact_match(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    """1.0 when the final answer (\\boxed{}, after '####', or the whole text) equals the reference."""
    return [float(_final_answer(r) == a.strip()) for r, a in zip(responses, answers)]


def math_verify(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    """1.0 when `math-verify` finds the response's answer mathematically equal to the reference."""
    from math_verify import parse, verify

    scores = []
    for response, answer in zip(responses, answers):
        answer = answer.rsplit("####", 1)[-1].strip()  # GSM8K-style references end in "#### <answer>"
        gold = parse(answer if "$" in answer or "\\" in answer else f"${answer}$")
        pred = parse(response)
        scores.append(float(bool(gold) and bool(pred) and verify(gold, pred)))
    return scores


def format_boxed(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    """1.0 when the response puts exactly one final answer in \\boxed{}."""
    return [float(len(_BOXED.findall(r)) == 1) for r in responses]


BUILTIN: dict[str, RewardFn] = {"exact_match": exact_match, "math_verify": math_verify, "format_boxed": format_boxed}


def resolve_reward(name: str, allowed_modules: Sequence[str] | None = None) -> RewardFn:
    """A built-in reward by name, or a `package.module:function` from an allowed module."""
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        raise InvalidArgument(f"unknown reward {name!r}: use one of {sorted(BUILTIN)} or package.module:function")
    return resolve_executable(name, allowed_modules, node_id="reward")


def score(fn: RewardFn, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    values = [float(v) for v in fn(prompts, responses, answers)]
    if len(values) != len(responses):
        raise InvalidArgument(f"reward function returned {len(values)} scores for {len(responses)} responses")
    return values
