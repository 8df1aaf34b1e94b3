"""Rewards apart from the scheduler (`step/user/worker_pool.py`, `step/user/reward_workers.py`), with real spawned
worker processes: a reward that raises fails its group with the reason; one that hangs is cut at its timeout and one
that kills its process gets the process restarted, while the other groups are scored and the call returns."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from meshrl.common.errors import DeadlineExceeded, InvalidArgument, Unavailable
from meshrl.scheduler.step.user.reward_workers import score_groups
from meshrl.scheduler.step.user.worker_pool import UserCodeFailed, WorkerPool

sys.path.insert(0, str(Path(__file__).parent))  # spawned workers inherit sys.path and import _user_code_faults
MOD = "_user_code_faults"


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2, call_timeout_s=1.5, allowed_modules=[MOD, "meshrl"]) as p:
        yield p


def test_a_reward_runs_in_a_worker_process(pool):
    assert pool.call("reward", f"{MOD}:length_reward", ([""], ["abc"], [""])) == [3.0]
    pids = {pool.call("reward", f"{MOD}:pid_reward", ([""], ["x"], [""]))[0] for _ in range(4)}
    assert pids == {float(p) for p in pool.pids()} and len(pids) == 2
    assert pool.call("reward", "exact_match", (["q"], ["\\boxed{4}"], ["4"])) == [1.0]  # built-ins too


def test_a_raising_reward_reports_its_error_and_the_worker_lives_on(pool):
    before = pool.pids()
    with pytest.raises(UserCodeFailed, match="ValueError: the reward cannot parse this"):
        pool.call("reward", f"{MOD}:raising_reward", ([""], ["a"], [""]))
    assert pool.pids() == before and pool.call("reward", f"{MOD}:length_reward", ([""], ["ab"], [""])) == [2.0]


def test_a_module_outside_the_allow_list_is_refused_in_the_worker(pool):
    with pytest.raises(UserCodeFailed, match="outside the allowed modules"):
        pool.call("reward", "os:getcwd", ([], [], []))


def test_a_hanging_reward_is_cut_at_its_timeout_and_its_worker_restarted(pool):
    restarts = pool.restarts
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="timeout of 1s"):
        for _ in range(2):  # whichever worker gets it
            pool.call("reward", f"{MOD}:hang_on_answer", ([""], ["a"], ["hang"]), timeout=1.0)
    assert time.monotonic() - started < 30
    assert pool.restarts == restarts + 1
    assert pool.call("reward", f"{MOD}:length_reward", ([""], ["abcd"], [""])) == [4.0]


def test_a_crashed_reward_process_is_restarted(pool):
    restarts, before = pool.restarts, set(pool.pids())
    with pytest.raises(Unavailable, match="died \\(exit code 3\\)"):
        pool.call("reward", f"{MOD}:hang_on_answer", ([""], ["a"], ["crash"]))
    assert pool.restarts == restarts + 1 and len(set(pool.pids()) - before) == 1
    assert [pool.call("reward", f"{MOD}:length_reward", ([""], ["a"], [""])) for _ in range(2)] == [[1.0], [1.0]]


def test_score_groups_fails_only_the_bad_groups_with_the_reason(pool):
    answers = ["ok", "ok", "hang", "hang", "crash", "crash", "ok", "ok"]
    groups = np.repeat(np.arange(4), 2)
    lines: list[str] = []
    out = score_groups(
        pool, f"{MOD}:hang_on_answer", [""] * 8, ["r"] * 8, answers, groups, retries=1, report=lines.append
    )
    assert out.rewards.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    assert sorted(out.failed_groups) == [1, 2] and out.retries == 2
    assert sum("group 1 failed (DeadlineExceeded" in line for line in lines) == 2
    assert sum("group 2 failed (Unavailable" in line for line in lines) == 2
    assert any("scored 0" in line for line in lines) and any("retrying" in line for line in lines)


def test_bad_pool_settings_and_batches_are_refused(pool):
    with pytest.raises(InvalidArgument, match="at least one worker"):
        WorkerPool(0, 1.0, None)
    with pytest.raises(InvalidArgument, match="timeout must be positive"):
        WorkerPool(1, 0.0, None)
    with pytest.raises(InvalidArgument, match="sizes differ"):
        score_groups(pool, f"{MOD}:length_reward", [""], ["a", "b"], [""], np.zeros(1), retries=0, report=print)


def test_the_reward_node_scores_apart_and_goes_on_past_a_hanging_group(tmp_path):
    """NodeHandlers.reward with `algorithm.reward_workers`, over a real data buffer: the hanging group scores 0
    after its timeout, the reason is logged, the other groups are scored and the node returns."""
    import redis

    from meshrl.common import batch_schema as S
    from meshrl.common.batch_key import batch_key
    from meshrl.common.codec import Ragged
    from meshrl.common.databuffer_client import DataBufferClient
    from meshrl.scheduler.config import JobConfig
    from meshrl.scheduler.step.dag.executor import StepContext
    from meshrl.scheduler.step.dag.nodes import NodeHandlers
    from meshrl.scheduler.step.prompts.data import PromptEncoder
    from meshrl.scheduler.step.user.user_code import UserCode
    from meshrl.scheduler.workflow import load_workflow_data
    from meshrl.trainer.model_builder import build_tokenizer
    from tests._databuffer import SYSTEM_REDIS, config, delete_prefix, serving, unique_prefix

    build_tokenizer().save_pretrained(tmp_path)
    cfg = JobConfig.model_validate(
        {
            "model": {"path": str(tmp_path)},
            "data": {"train": "unused.jsonl"},
            "job": {"allowed_modules": [MOD, "meshrl"]},
            "algorithm": {
                "reward": f"{MOD}:hang_on_answer",
                "reward_workers": 2,
                "reward_timeout_seconds": 1.0,
                "reward_retries": 0,
            },
        }
    )
    wf = load_workflow_data(
        {
            "dag_id": "r",
            "nodes": [
                {"node_id": "rollout", "node_type": "ROLLOUT", "node_role": "ROLLOUT"},
                {"node_id": "reward", "node_type": "COMPUTE", "node_role": "REWARD", "dependencies": ["rollout"]},
            ],
        }
    )
    lines: list[str] = []
    prefix = unique_prefix("rewardnode")
    with serving(config(SYSTEM_REDIS, prefix)) as (_, running):
        buffer = DataBufferClient(running.address)
        user = UserCode(cfg, wf.nodes, lines.append)
        try:
            source = batch_key("j", 1, "rollout")
            answers = [b"ok", b"ok", b"hang", b"hang"]
            buffer.put(
                source,
                {
                    S.PROMPT_IDS: Ragged.from_rows([[1, 2]] * 4, dtype=np.int32),
                    S.RESPONSE_IDS: Ragged.from_rows([[3], [4], [5], [6]], dtype=np.int32),
                    S.ANSWER: Ragged.from_rows([np.frombuffer(a, np.uint8) for a in answers], dtype=np.uint8),
                    S.GROUP_INDEX: np.array([0, 0, 1, 1], dtype=np.int64),
                },
            )
            handlers = NodeHandlers(cfg, buffer, None, None, PromptEncoder(str(tmp_path)), None, None, user)
            nodes = {n.node_id: n for n in wf.nodes}
            ctx = StepContext("j", 1, nodes=nodes)
            ctx.results["rollout"] = type("R", (), {"outputs": [source], "rewrites_rows": True})()
            result = handlers.reward(nodes["reward"], ctx)
            rewards = buffer.get(result.outputs[0])[S.REWARDS].tolist()
        finally:
            user.close()
            buffer.close()
    delete_prefix(redis.Redis.from_url(SYSTEM_REDIS), prefix)
    assert rewards == [1.0, 1.0, 0.0, 0.0] and result.metrics["reward/failed_groups"] == 1.0
    assert any("group 1 failed (DeadlineExceeded" in line and "scored 0" in line for line in lines)
