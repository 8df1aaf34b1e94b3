"""Multi-turn episodes of a ROLLOUT node that names an environment: n episodes per prompt, token in, token out.

Each episode makes one environment instance in a worker process (`WorkerPool.open`), asks it for the first
user message, then alternates: the model's turn through the rollout router (`RolloutRouter.generate` with the
episode's session id, so router affinity keeps it on one replica and its prefix cache), then `env.step` on the
decoded turn. The trajectory is the prompt ids, then exactly the ids the engine produced and the ids of the
environment's turns (`ChatTurns.observation_ids`) appended in order, never re-encoded; model tokens keep their
log-prob and weight version, environment tokens get log-prob 0, version -1 and loss mask 0. Limits (turns,
trajectory tokens, wall seconds) end an episode with a recorded reason; so does an environment that raises,
hangs past its timeout or kills its worker (reward 0, the reason in the job's events).
Called by `NodeHandlers.rollout` (step/dag/nodes.py).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshrl.api.common.v1 import tensor_pb2
from meshrl.common import batch_schema as S
from meshrl.common.codec import Ragged
from meshrl.common.errors import DeadlineExceeded, InvalidArgument, MeshrlError
from meshrl.scheduler.environments.base import as_step_result
from meshrl.scheduler.environments.chat import ChatTurns
from meshrl.scheduler.step.user.worker_pool import WorkerPool

# Why an episode ended (EPISODE_END column, the job's events).
# The ROLLOUT node-config keys of a multi-turn episode (besides n, temperature, top_p and max_tokens, which is
# the limit of one model turn); only a node with an environment reads them.
EPISODE_KEYS = ("max_turns", "max_episode_tokens", "max_episode_seconds")

DONE, MAX_TURNS, MAX_TOKENS, MAX_SECONDS, ENV_ERROR = "done", "max_turns", "max_tokens", "max_seconds", "env_error"


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 4  # model turns
    max_tokens: int = 256  # trajectory tokens after the first prompt (model and environment)
    max_seconds: float = 60.0  # wall time of the whole episode
    turn_tokens: int = 32  # at most this many new tokens per model turn

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens", "max_seconds", "turn_tokens"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(
                    f"episode limit {name} = {getattr(self, name)} must be positive", field=f"config.{name}"
                )


@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    end: str = ""
    error: str = ""
    finish_reason: int = 0

    def add_model(self, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]) -> None:
        self.response_ids += list(ids)
        self.loss_mask += [1.0] * len(ids)
        self.logprobs += list(logprobs)
        self.versions += list(versions)

    def add_environment(self, ids: Sequence[int]) -> None:
        self.response_ids += list(ids)
        self.loss_mask += [0.0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def model_versions(self) -> list[int]:
        return [v for v in self.versions if v >= 0]


GenerateFn = Callable[..., Any]  # RolloutRouter.generate: (prompt_ids, sampling=, session_id=, timeout=) -> result


def run_episode(
    pool: WorkerPool,
    env_ref: str,
    prompt: str,
    answer: str,
    generate: GenerateFn,
    turns: ChatTurns,
    limits: EpisodeLimits,
    sampling: dict[str, Any],
    session_id: str,
) -> Trajectory:
    """One episode; never raises for the environment's failures (they end it with ENV_ERROR)."""
    deadline = time.monotonic() + limits.max_seconds
    try:
        handle, tools = pool.open(env_ref)
    except MeshrlError as exc:
        return Trajectory(turns.first_prompt(prompt), end=ENV_ERROR, error=str(exc))
    try:
        try:
            first = pool.method(handle, "reset", (prompt, answer))
        except MeshrlError as exc:
            return Trajectory(turns.first_prompt(prompt), end=ENV_ERROR, error=str(exc))
        traj = Trajectory(turns.first_prompt(str(first), tools))
        while not traj.end:
            traj.end = _turn(pool, handle, traj, generate, turns, limits, sampling, session_id, deadline)
        return traj
    finally:
        pool.close_object(handle)


def _turn(
    pool,
    handle,
    traj: Trajectory,
    generate,
    turns: ChatTurns,
    limits: EpisodeLimits,
    sampling,
    session_id,
    deadline: float,
) -> str:
    """Runs one model turn and the environment's answer; returns why the episode ends, or "" to go on."""
    if traj.turns >= limits.max_turns:
        return MAX_TURNS
    room = limits.max_tokens - len(traj.response_ids)
    if room <= 0:
        return MAX_TOKENS
    left = deadline - time.monotonic()
    if left <= 0:
        return MAX_SECONDS
    params = dict(sampling, max_tokens=min(limits.turn_tokens, room))
    try:
        out = generate(traj.prompt_ids + traj.response_ids, sampling=params, session_id=session_id, timeout=left)
    except DeadlineExceeded:
        return MAX_SECONDS
    traj.add_model(out.token_ids, out.logprobs, out.weight_versions)
    traj.turns += 1
    traj.finish_reason = int(out.finish_reason)
    try:
        step = as_step_result(pool.method(handle, "step", (turns.decode(out.token_ids),)))
    except MeshrlError as exc:
        traj.error = str(exc)
        return ENV_ERROR
    traj.reward += step.reward
    if step.done:
        return DONE
    env_ids = turns.observation_ids(step.observation, step.role, list(out.token_ids))
    if len(traj.response_ids) + len(env_ids) >= limits.max_tokens:
        return MAX_TOKENS  # no room for the observation and a model turn after it
    if time.monotonic() >= deadline:
        return MAX_SECONDS
    traj.add_environment(env_ids)
    return ""


def run_episodes(
    pool: WorkerPool,
    env_ref: str,
    prompts: list[str],
    answers: list[str],
    n: int,
    generate: GenerateFn,
    turns: ChatTurns,
    limits: EpisodeLimits,
    sampling: dict[str, Any],
    session_prefix: str,
    concurrency: int = 256,
) -> list[Trajectory]:
    """n episodes per prompt, concurrently; trajectories in (prompt, sample) order."""
    jobs = [(p, k) for p in range(len(prompts)) for k in range(n)]
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(jobs)))) as threads:
        return list(
            threads.map(
                lambda job: run_episode(
                    pool,
                    env_ref,
                    prompts[job[0]],
                    answers[job[0]],
                    generate,
                    turns,
                    limits,
                    sampling,
                    f"{session_prefix}/{job[0]}/{job[1]}",
                ),
                jobs,
            )
        )


def trajectory_columns(
    trajs: list[Trajectory], answers: Ragged, n: int, job_id: str, step: int, success_at: float = 1.0
) -> tuple[dict[str, object], list[tensor_pb2.SampleMeta]]:
    """The ROLLOUT node's output batch (one row per episode) and its per-sample metadata."""
    rows = [i // n for i in range(len(trajs))]
    rewards = np.array([t.reward for t in trajs], dtype=np.float32)
    columns: dict[str, object] = {
        S.PROMPT_IDS: Ragged.from_rows([t.prompt_ids for t in trajs], dtype=np.int32),
        S.ANSWER: Ragged.from_rows([answers.row(r) for r in rows], dtype=np.uint8),
        S.RESPONSE_IDS: Ragged.from_rows([t.response_ids for t in trajs], dtype=np.int32),
        S.ROLLOUT_LOGPROBS: Ragged.from_rows([t.logprobs for t in trajs], dtype=np.float32),
        S.RESPONSE_VERSIONS: Ragged.from_rows([t.versions for t in trajs], dtype=np.int32),
        S.LOSS_MASK: Ragged.from_rows([t.loss_mask for t in trajs], dtype=np.float32),
        S.GROUP_INDEX: np.asarray(rows, dtype=np.int64),
        S.REWARDS: rewards,
        S.ACCURACY: (rewards >= success_at).astype(np.float32),
        S.EPISODE_TURNS: np.array([t.turns for t in trajs], dtype=np.int32),
        S.EPISODE_END: Ragged.from_rows([np.frombuffer(t.end.encode(), np.uint8) for t in trajs], dtype=np.uint8),
    }
    samples = []
    for i, (row, t) in enumerate(zip(rows, trajs)):
        versions = t.model_versions() or [0]
        group = f"{job_id}/{step}/{row}"
        samples.append(
            tensor_pb2.SampleMeta(
                job_id=job_id,
                step=step,
                group_id=group,
                index_in_group=i % n,
                weight_version=min(versions),
                max_weight_version=max(versions),
                finish_reason=t.finish_reason,
                sample_id=f"{group}/{i % n}",
            )
        )
    return columns, samples


def episode_metrics(trajs: list[Trajectory], seconds: float) -> dict[str, float]:
    if not trajs:
        return {}
    ends = Counter(t.end for t in trajs)
    model_tokens = sum(int(sum(t.loss_mask)) for t in trajs)
    out = {
        "episode/turns_mean": float(np.mean([t.turns for t in trajs])),
        "episode/length_mean": float(np.mean([len(t.response_ids) for t in trajs])),
        "episode/reward_mean": float(np.mean([t.reward for t in trajs])),
        "rollout/generated_tokens": float(model_tokens),
        "rollout/seconds": seconds,
        "rollout/tokens_per_second": model_tokens / max(seconds, 1e-9),
    }
    out.update({f"episode/end_{reason}": count / len(trajs) for reason, count in ends.items()})
    return out
