"""User code that misbehaves, for the worker-pool tests (imported by name inside spawned worker processes):
rewards that score, raise, hang or kill their process, and environments for the episode tests."""

from __future__ import annotations

import os
import time

from meshrl.scheduler.environments import Environment, StepResult


def length_reward(prompts, responses, answers):
    return [float(len(r)) for r in responses]


def raising_reward(prompts, responses, answers):
    raise ValueError("the reward cannot parse this")


def hang_on_answer(prompts, responses, answers):
    """Hangs on groups whose answer is "hang", kills its process on "crash", else scores 1.0."""
    if answers[0] == "hang":
        time.sleep(600)
    if answers[0] == "crash":
        os._exit(3)
    return [1.0] * len(responses)


def pid_reward(prompts, responses, answers):
    return [float(os.getpid())] * len(responses)


class EchoEnv(Environment):
    """Replies "seen <n>" to each turn; ends with reward 1 on the third turn."""

    tools = [{"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}]

    def reset(self, prompt: str, answer: str) -> str:
        self.turn = 0
        return f"task {prompt}"

    def step(self, turn: str) -> StepResult:
        self.turn += 1
        return StepResult(f"seen {self.turn}", reward=1.0 if self.turn == 3 else 0.0, done=self.turn == 3)


class NeverDoneEnv(Environment):
    def step(self, turn: str) -> StepResult:
        return StepResult("again", reward=0.25)


class HangingEnv(Environment):
    def step(self, turn: str) -> StepResult:
        time.sleep(600)
        return StepResult("late")
