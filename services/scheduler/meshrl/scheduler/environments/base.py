"""The environment interface a multi-turn ROLLOUT node drives, one instance per episode.

    class MyEnv(Environment):
        tools = [{"type": "function", "function": {"name": "calc", "description": "...",
                  "parameters": {"type": "object", "properties": {...}}}}]   # the chat template's tool format

        def reset(self, prompt: str, answer: str) -> str:     # the task -> the first user message
            ...
        def step(self, turn: str) -> StepResult:              # the model's turn (decoded text)
            return StepResult(observation="...", reward=0.0, done=False, role="tool")

The episode's reward is the sum of its steps' rewards; `done` ends it; `observation` is rendered as a message
of `role` with the model's chat template and appended as tokens (masked out of the loss). `tools` is passed to
the chat template of the first prompt (`apply_chat_template(..., tools=...)`), so a model whose template renders
tools sees them. Instances are made by `ref()` with no arguments inside a worker process (so they must be
importable from an allowed module) and live for one episode. `step` may also return a tuple
(observation, reward, done).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from meshrl.common.errors import InvalidArgument


@dataclass
class StepResult:
    observation: str = ""
    reward: float = 0.0
    done: bool = False
    role: str = "user"  # the chat role the observation is rendered as ("user", "tool", ...)


class Environment:
    """Base class (optional: any class with `reset` and `step` of these shapes serves)."""

    tools: ClassVar[list[dict[str, Any]]] = []

    def reset(self, prompt: str, answer: str) -> str:
        """Starts an episode on one dataset row; returns the first user message (the prompt by default)."""
        return prompt

    def step(self, turn: str) -> StepResult:
        raise InvalidArgument(f"{type(self).__name__} does not define step(turn) -> StepResult")


def integer_answer(answer: str, task: str) -> int:
    """A dataset row's answer as an integer (for environments whose reference is a number)."""
    try:
        return int(answer)
    except ValueError:
        raise InvalidArgument(f"{task} answer {answer!r} is not an integer; fix the dataset's answer column") from None


def as_step_result(value: Any) -> StepResult:
    """A StepResult from what `step` returned (a StepResult or an (observation, reward, done) tuple)."""
    if isinstance(value, StepResult):
        result = value
    elif isinstance(value, tuple) and len(value) in (3, 4):
        result = StepResult(*value)
    else:
        raise InvalidArgument(
            f"environment step returned {type(value).__name__}; return StepResult(observation, reward, done) "
            "or a tuple (observation, reward, done)"
        )
    if not isinstance(result.observation, str):
        raise InvalidArgument(f"environment observation must be a str, got {type(result.observation).__name__}")
    return StepResult(result.observation, float(result.reward), bool(result.done), str(result.role))
