"""Rewards scored apart from the scheduler: one call per group in a worker process, with a timeout, retries and
a crash boundary.

A group whose reward raises, runs past `algorithm.reward_timeout_seconds` or kills its worker is retried
(`algorithm.reward_retries` times); a group that still fails scores 0 for every sample (so it carries no
gradient under group-normalised advantages) and is reported through `report` (the job's events), and the step
goes on. Called by `NodeHandlers.reward` (step/dag/nodes.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from meshrl.common.errors import InvalidArgument, MeshrlError
from meshrl.scheduler.step.user.worker_pool import WorkerPool


@dataclass
class GroupScores:
    rewards: np.ndarray  # float32 [N]
    failed_groups: list[int] = field(default_factory=list)
    retries: int = 0


def _one_group(
    pool: WorkerPool, ref: str, group: int, prompts, responses, answers, retries: int, report: Callable[[str], None]
) -> tuple[list[float] | None, int]:
    tries = 0
    while True:
        try:
            values = [float(v) for v in pool.call("reward", ref, (list(prompts), list(responses), list(answers)))]
            if len(values) != len(responses):
                raise InvalidArgument(f"reward {ref} returned {len(values)} scores for {len(responses)} responses")
            return values, tries
        except MeshrlError as exc:
            tries += 1
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            last = tries > retries
            action = "scored 0 (no gradient from this group)" if last else "retrying"
            report(f"reward of group {group} failed ({type(exc).__name__}: {first_line}); {action}")
            if last:
                return None, tries - 1


def score_groups(
    pool: WorkerPool,
    ref: str,
    prompts: Sequence[str],
    responses: Sequence[str],
    answers: Sequence[str],
    groups: np.ndarray,
    *,
    retries: int,
    report: Callable[[str], None],
) -> GroupScores:
    """Rewards of every row, one worker call per group (rows of equal `groups` value), groups concurrently."""
    if not (len(prompts) == len(responses) == len(answers) == len(groups)):
        raise InvalidArgument(
            f"reward batch sizes differ: {len(prompts)} prompts, {len(responses)} responses, "
            f"{len(answers)} answers, {len(groups)} group indices"
        )
    rewards = np.zeros(len(responses), dtype=np.float32)
    members: dict[int, list[int]] = {}
    for row, g in enumerate(np.asarray(groups).tolist()):
        members.setdefault(int(g), []).append(row)
    result = GroupScores(rewards)

    def run(item: tuple[int, list[int]]):
        g, rows = item
        return (
            g,
            rows,
            _one_group(
                pool,
                ref,
                g,
                [prompts[r] for r in rows],
                [responses[r] for r in rows],
                [answers[r] for r in rows],
                retries,
                report,
            ),
        )

    with ThreadPoolExecutor(max_workers=max(1, min(len(members), 2 * len(pool.pids())))) as threads:
        for g, rows, (values, tries) in threads.map(run, members.items()):
            result.retries += tries
            if values is None:
                result.failed_groups.append(g)
            else:
                rewards[rows] = values
    return result
