"""The calculator example's environment and data: two-digit multiplications the tiny model cannot do in its
head, a `calc` tool it may call, and a final answer it must give after reading the tool's result.

    user:      37*41                      (the task, from the dataset row's prompt)
    assistant: calc 37*41                 (a tool call: the turn starts with "calc ")
    tool:      1517                       (the tool's result, an environment turn, masked out of the loss)
    assistant: 1517                       (any other turn is the final answer: reward 1 when it is right)

The tool evaluates with the countdown example's expression parser (`examples.countdown.reward.evaluate`:
integers, + - * / and parentheses, nothing `eval`-ed). Named by the workflow's ROLLOUT node
(`executable_ref: examples.calculator.env:CalculatorEnv`); `write_dataset` is the job's `data.generator`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from examples.countdown.reward import evaluate
from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.environments import Environment, StepResult, integer_answer

TOOL_PREFIX = "calc "
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluates an arithmetic expression of integers with + - * / and parentheses",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


class CalculatorEnv(Environment):
    """One episode: tool calls are answered with their value; the first other turn ends it."""

    tools = [CALC_TOOL]

    def reset(self, prompt: str, answer: str) -> str:
        self.answer = integer_answer(answer, "calculator")
        return prompt

    def step(self, turn: str) -> StepResult:
        text = turn.strip()
        if text.startswith(TOOL_PREFIX.strip()):
            result = evaluate(text[len(TOOL_PREFIX.strip()) :])
            value = result[0] if result is not None else None
            shown = str(value.numerator) if value is not None and value.denominator == 1 else "error"
            return StepResult(shown, reward=0.0, done=False, role="tool")
        return StepResult("", reward=1.0 if text == str(self.answer) else 0.0, done=True)


def demonstration(a: int, b: int) -> str:
    """One whole episode as the warm-up's target text: the tool call, the tool's turn and the answer, in the
    ChatML turns of the model this example builds (`meshrl.trainer.model_builder`'s chat template, whose
    special tokens the tokenizer reads back as single tokens)."""
    return f"{TOOL_PREFIX}{a}*{b}<|im_end|>\n<|im_start|>tool\n{a * b}<|im_end|>\n<|im_start|>assistant\n{a * b}"


def write_dataset(out_dir: str | Path, seed: int = 0, n_train: int = 4000, n_eval: int = 256) -> tuple[Path, Path]:
    """OUT_DIR/train.jsonl and eval.jsonl: rows {prompt: "37*41", answer: "1517", solution: demonstration};
    eval pairs never occur in train. The solution is the warm-up's target: a demonstration episode (the warm-up
    trains on all of it, the tool's turn included; RL then trains on the model's own turns only)."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    rng.shuffle(pairs)
    if n_train + n_eval > len(pairs):
        raise InvalidArgument(f"n_train + n_eval = {n_train + n_eval} exceeds the {len(pairs)} distinct tasks")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "train.jsonl", out / "eval.jsonl")
    for path, chunk in zip(paths, (pairs[n_eval : n_eval + n_train], pairs[:n_eval])):
        rows = [{"prompt": f"{a}*{b}", "answer": str(a * b), "solution": demonstration(a, b)} for a, b in chunk]
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return paths
