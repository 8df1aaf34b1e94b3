"""The countdown reward on hand-written cases: correct, wrong value, wrong numbers, malformed, batch checks."""

import pytest

from examples.countdown import reward
from meshrl.common.errors import InvalidArgument

ANSWER = "target:16 numbers:3,7,5"


@pytest.mark.parametrize("response", ["3*7-5", "7*3-5", " 3 * 7 - 5 ", "(7*3)-5", "3*7-(5)", "((3*7)-5)"])
def test_correct_expressions_score_one(response):
    assert reward.score_one(response, ANSWER) == 1.0
    assert reward.is_correct(response, ANSWER)


@pytest.mark.parametrize(
    "response",
    [
        "3+7+5",  # right numbers, value 15
        "3*7",  # a number missing
        "3*7-5+0",  # an extra number
        "3*7-5-5+5",  # a number used twice
        "21-5",  # right value, wrong numbers
        "16",
        "",
        "3*7-",  # malformed
        "(3*7-5",
        "3*7)-5",
        "3 7 5",
        "3*7-5=16",  # only the expression is accepted
        "abc",
        "7*3-5/0",
    ],
)
def test_wrong_responses_score_zero(response):
    assert reward.score_one(response, ANSWER) == 0.0
    assert not reward.is_correct(response, ANSWER)


def test_precedence_and_exact_division():
    assert reward.evaluate("2+3*4")[0] == 14
    assert reward.evaluate("(2+3)*4")[0] == 20
    assert reward.evaluate("7/2*2")[0] == 7
    assert reward.score_one("8/4+9", "target:11 numbers:9,8,4") == 1.0
    assert reward.score_one("9/2+8", "target:12 numbers:9,8,2") == 0.0  # 12.5


def test_format_reward_only_for_right_numbers():
    assert reward.score_one("3+7+5", ANSWER, format_reward=0.1) == 0.1
    assert reward.score_one("3+7", ANSWER, format_reward=0.1) == 0.0
    assert reward.score_one("3*7-5", ANSWER, format_reward=0.1) == 1.0


def test_batch_score_and_size_check():
    assert reward.score(["p", "p", "p"], ["3*7-5", "3+7+5", "x"], [ANSWER] * 3) == [1.0, 0.0, 0.0]
    assert reward.score([], ["3*7-5"], [ANSWER]) == [1.0]
    with pytest.raises(InvalidArgument, match="sizes differ"):
        reward.score(["p"], ["3*7-5", "1"], [ANSWER])


def test_malformed_answer_spec_is_refused():
    with pytest.raises(InvalidArgument, match="target:T numbers"):
        reward.score_one("3*7-5", "16")
