"""The countdown example's rule-based reward: 1.0 when the response is an expression that uses every given
number exactly once and evaluates to the target, else 0.0 (or FORMAT_REWARD for a well-formed expression
over the right numbers with the wrong value, when that is set above 0).

Called by the scheduler's reward node (`examples.countdown.reward:score`), the evaluation and
bench/e2e/recipe_probe.py. Pure Python: expressions are parsed by a small recursive-descent parser over
integers, + - * / and parentheses with exact rational arithmetic; nothing is ever `eval`-ed.
"""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

from meshrl.common.errors import InvalidArgument

FORMAT_REWARD = 0.0
_ANSWER_RE = re.compile(r"^\s*target:(-?\d+)\s+numbers:(\d+(?:,\d+)*)\s*$")
_TOKEN_RE = re.compile(r"\s*(\d+|[-+*/()])")
_MAX_LEN = 64


def parse_answer(answer: str) -> tuple[int, list[int]]:
    """'target:16 numbers:3,7,5' -> (16, [3, 7, 5])."""
    match = _ANSWER_RE.match(answer)
    if match is None:
        raise InvalidArgument(
            f"countdown answer {answer!r} is not 'target:T numbers:a,b,c'; write it with examples.countdown.make_data"
        )
    return int(match.group(1)), [int(x) for x in match.group(2).split(",")]


class _Parser:
    """expr := term (('+'|'-') term)*; term := atom (('*'|'/') atom)*; atom := INT | '(' expr ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.numbers: list[int] = []

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self) -> str:
        tok = self._peek()
        if tok is None:
            raise ValueError("unexpected end of expression")
        self.pos += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self._peek() in ("+", "-"):
            op = self._take()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.atom()
        while self._peek() in ("*", "/"):
            op = self._take()
            rhs = self.atom()
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                raise ValueError("division by zero")
            else:
                value = value / rhs
        return value

    def atom(self) -> Fraction:
        tok = self._take()
        if tok == "(":
            value = self.expr()
            if self._take() != ")":
                raise ValueError("unbalanced parenthesis")
            return value
        if tok.isdigit():
            self.numbers.append(int(tok))
            return Fraction(int(tok))
        raise ValueError(f"unexpected token {tok!r}")


def evaluate(expression: str) -> tuple[Fraction, list[int]] | None:
    """Value and the integers used by `expression`, or None when it is not a well-formed expression."""
    text = expression.strip()
    if not text or len(text) > _MAX_LEN:
        return None
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            return None
        tokens.append(match.group(1))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    parser = _Parser(tokens)
    try:
        value = parser.expr()
    except ValueError:
        return None
    if parser.pos != len(tokens):
        return None
    return value, parser.numbers


def score_one(response: str, answer: str, format_reward: float = FORMAT_REWARD) -> float:
    """1.0 for a correct expression, `format_reward` for a well-formed one over the right numbers, else 0.0."""
    target, numbers = parse_answer(answer)
    result = evaluate(response)
    if result is None:
        return 0.0
    value, used = result
    if Counter(used) != Counter(numbers):
        return 0.0
    return 1.0 if value == target else format_reward


def is_correct(response: str, answer: str) -> bool:
    """Exact correctness, the evaluation's accuracy (no format credit)."""
    return score_one(response, answer, format_reward=0.0) == 1.0


def score(prompts: list[str], responses: list[str], answers: list[str]) -> list[float]:
    """Rewards for a batch (prompts are not needed: each answer carries the numbers and the target)."""
    if len(responses) != len(answers) or (prompts and len(prompts) != len(responses)):
        raise InvalidArgument(
            f"reward batch sizes differ: {len(prompts)} prompts, {len(responses)} responses, {len(answers)} answers"
        )
    return [score_one(r, a) for r, a in zip(responses, answers)]
