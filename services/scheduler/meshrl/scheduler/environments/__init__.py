"""Environments for multi-turn and tool-use episodes: the interface users implement (`base.py`) and how a
trajectory's environment turns are rendered as tokens with the model's chat template (`chat.py`).

A ROLLOUT node names its environment by `executable_ref` (a class, `package.module:Class`); the episodes run
in `meshrl.scheduler.step.user.episodes`, the environment itself in a worker process (`step/user/worker_pool.py`).
"""

from meshrl.scheduler.environments.base import Environment, StepResult, as_step_result, integer_answer

__all__ = ["Environment", "StepResult", "as_step_result", "integer_answer"]
