"""Built-in rewards and user reward functions by reference (with the module allow-list)."""

import pytest

from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.step.scoring.rewards import exact_match, format_boxed, math_verify, resolve_reward, score


def test_exact_match_reads_the_final_answer():
    responses = ["\\boxed{42}", "so #### 42", " 42 ", "41"]
    assert exact_match([""] * 4, responses, ["42"] * 4) == [1.0, 1.0, 1.0, 0.0]


def test_math_verify_accepts_equal_values():
    assert math_verify(["", ""], ["The answer is $\\frac{1}{2}$", "$0.3$"], ["0.5", "1/2"]) == [1.0, 0.0]


def test_format_boxed():
    assert format_boxed(["", ""], ["\\boxed{1}", "\\boxed{1} \\boxed{2}"], ["", ""]) == [1.0, 0.0]


def test_references_and_errors():
    assert resolve_reward("exact_match") is exact_match
    assert resolve_reward("examples.countdown.reward:score", ["examples"]).__name__ == "score"
    with pytest.raises(InvalidArgument, match="unknown reward 'exactmatch'"):
        resolve_reward("exactmatch")
    with pytest.raises(InvalidArgument):  # not an allowed module
        resolve_reward("examples.countdown.reward:score", ["meshrl"])
    with pytest.raises(InvalidArgument, match="returned 1 scores for 2 responses"):
        score(lambda p, r, a: [1.0], ["", ""], ["a", "b"], ["a", "b"])
