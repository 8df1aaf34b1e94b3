"""A job's user code that runs apart from the scheduler: the reward worker pool (`algorithm.reward_workers`)
and the environment worker pool with the settings of the ROLLOUT node that names an environment.

Made by `JobRunner.run_job` for the job's lifetime and closed with it; `NodeHandlers` (step/dag/nodes.py) runs the
reward node and the multi-turn rollout through it, and the held-out evaluation of an environment workflow runs
its episodes greedily through `evaluate_episodes`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.environments.chat import ChatTurns
from meshrl.scheduler.step.user.episodes import ENV_ERROR, EpisodeLimits, Trajectory, episode_metrics, run_episodes
from meshrl.scheduler.step.user.reward_workers import GroupScores, score_groups
from meshrl.scheduler.step.user.worker_pool import WorkerPool
from meshrl.scheduler.workflow import NodeType
from meshrl.scheduler.workflow.model import Node


def environment_node(nodes: Sequence[Any]) -> Any | None:
    """The ROLLOUT node that names an environment (executable_ref), if any."""
    return next((n for n in nodes if n.node_type == NodeType.ROLLOUT and n.executable_ref), None)


class UserCode:
    def __init__(self, cfg: JobConfig, nodes: Sequence[Any], log: Callable[[str], None]) -> None:
        a, allowed = cfg.algorithm, cfg.job.allowed_modules
        self.cfg = cfg
        self.log = log
        self.env_node = environment_node(nodes)
        self.rewards = WorkerPool(a.reward_workers, a.reward_timeout_seconds, allowed) if a.reward_workers else None
        self.environments = (
            WorkerPool(a.environment_workers, a.environment_timeout_seconds, allowed) if self.env_node else None
        )
        self._turns: ChatTurns | None = None

    def turns(self, encoder: Any) -> ChatTurns:
        if self._turns is None:
            self._turns = ChatTurns(encoder.tokenizer, encoder.system_prompt)
        return self._turns

    # -- rewards -----------------------------------------------------------------------------
    def score(self, ref: str, prompts, responses, answers, groups: np.ndarray) -> GroupScores:
        a = self.cfg.algorithm
        return score_groups(
            self.rewards, ref, prompts, responses, answers, groups, retries=a.reward_retries, report=self.log
        )

    # -- episodes ----------------------------------------------------------------------------
    def limits(self, node: Node, turn_tokens: int | None = None) -> EpisodeLimits:
        c = node.config
        return EpisodeLimits(
            max_turns=int(c.get("max_turns", EpisodeLimits.max_turns)),
            max_tokens=int(c.get("max_episode_tokens", EpisodeLimits.max_tokens)),
            max_seconds=float(c.get("max_episode_seconds", EpisodeLimits.max_seconds)),
            turn_tokens=turn_tokens or int(c.get("max_tokens", self.cfg.rollout.max_tokens)),
        )

    def episodes(
        self,
        node: Node,
        router: Any,
        encoder: Any,
        prompts: list[str],
        answers: list[str],
        *,
        n: int,
        sampling: dict[str, Any],
        session: str,
        limits: EpisodeLimits | None = None,
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """n episodes per prompt of `node`'s environment; environment errors are reported in one line."""
        started = time.monotonic()
        trajs = run_episodes(
            self.environments,
            node.executable_ref,
            prompts,
            answers,
            n,
            router.generate,
            self.turns(encoder),
            limits or self.limits(node),
            sampling,
            session,
            concurrency=self.cfg.rollout.max_batch_size,
        )
        failed = [t for t in trajs if t.end == ENV_ERROR]
        if failed:
            first = failed[0].error.splitlines()[0] if failed[0].error else ""
            self.log(
                f"{session}: {len(failed)} of {len(trajs)} episodes ended by an environment error (reward 0); "
                f"first: {first}"
            )
        return trajs, episode_metrics(trajs, time.monotonic() - started)

    def evaluate_episodes(self, router: Any, encoder: Any, records: list[Any], session: str) -> dict[str, float]:
        """Held-out success: one greedy episode per record; success = the episode's reward reaches 1."""
        limits = self.limits(self.env_node, self.cfg.eval.max_tokens)
        trajs, metrics = self.episodes(
            self.env_node,
            router,
            encoder,
            [x.prompt for x in records],
            [x.answer for x in records],
            n=1,
            sampling={"temperature": 0.0, "top_p": 1.0},
            session=session,
            limits=limits,
        )
        rewards = np.array([t.reward for t in trajs], dtype=np.float64)
        return {
            "eval/accuracy": float((rewards >= 1.0).mean()) if len(rewards) else 0.0,
            "eval/reward_mean": float(rewards.mean()) if len(rewards) else 0.0,
            "eval/turns": metrics.get("episode/turns_mean", 0.0),
            "eval/response_length": metrics.get("episode/length_mean", 0.0),
            "eval/prompts": float(len(records)),
            "eval/seconds": metrics.get("rollout/seconds", 0.0),
        }

    def close(self) -> None:
        for pool in (self.rewards, self.environments):
            if pool is not None:
                pool.close()
