"""Row alignment across the asynchronous split, on the default example's DAG (data_load -> rollout -> reward ->
advantage -> actor_train: the advantage runs on the producer side, the trainer computes pi_old itself): every
row the train node gets carries its own response, rollout log-probs, token versions, reward and advantages,
whatever order the rollout wrote its rows in, however long each response is, and however the stream's groups
are concatenated and renumbered for the step. Over a real data buffer (gRPC + Redis streams)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.scheduler.events import EventLog
from meshrl.scheduler.step.dag.executor import NodeResult, StepExecutor
from meshrl.scheduler.step.pacing.modes import AsyncPlan, split_at_rollout
from meshrl.scheduler.step.pacing.pipeline import AsyncSteps
from meshrl.scheduler.workflow import NodeRole, NodeType
from tests._databuffer import served_client
from tests.unit.scheduler._step_nodes import Node

PROMPTS = 4  # groups per round
N = 3  # samples per group


def countdown_like() -> list[Node]:
    T, R = NodeType, NodeRole
    return [
        Node("data_load", T.DATA_LOAD, R.DATA),
        Node("rollout", T.ROLLOUT, R.ROLLOUT, ["data_load"]),
        Node("reward", T.COMPUTE, R.REWARD, ["rollout"]),
        Node("advantage", T.COMPUTE, R.ADVANTAGE, ["reward"]),
        Node("actor_train", T.MODEL_TRAIN, R.ACTOR, ["advantage"]),
    ]


def sample_id(round_: int, row: int) -> int:
    return round_ * 100 + row


def logprobs_of(uid: int, length: int) -> np.ndarray:
    return -(uid + np.arange(length) / 10.0).astype(np.float32) / 1000.0


class Sim:
    """The rollout writes its rows interleaved by group (row i belongs to group i % PROMPTS) with responses of
    1-3 tokens, each token's id the row's sample id; reward and advantage are functions of that id, read back
    from the buffer as the built-in nodes would. The trainer records every batch it is given."""

    def __init__(self, buffer: DataBufferClient) -> None:
        self.buffer = buffer
        self.fleet_version = 1
        self.update_mid_round: set[int] = set()  # rounds whose later tokens come from the next version
        self.trained: list[tuple[int, dict]] = []  # (step, the columns the train node got)

    def __call__(self, node, ctx) -> NodeResult:
        key = batch_key(ctx.job_id, ctx.step, node.node_id)
        if node.node_id == "data_load":
            self.buffer.put(key, {S.PROMPT_INDEX: np.arange(PROMPTS, dtype=np.int64) + 10 * ctx.step})
            return NodeResult([key], rows=PROMPTS)
        if node.node_id == "rollout":
            rows = PROMPTS * N
            ids = [sample_id(ctx.step, i) for i in range(rows)]
            lengths = [1 + i % 3 for i in range(rows)]
            late = self.fleet_version + (ctx.step in self.update_mid_round)
            self.buffer.put(
                key,
                {
                    S.RESPONSE_IDS: Ragged.from_rows([np.full(n, u, np.int32) for u, n in zip(ids, lengths)], np.int32),
                    S.ROLLOUT_LOGPROBS: Ragged.from_rows([logprobs_of(u, n) for u, n in zip(ids, lengths)], np.float32),
                    S.RESPONSE_VERSIONS: Ragged.from_rows(
                        [np.array([self.fleet_version] + [late] * (n - 1), np.int32) for n in lengths], np.int32
                    ),
                    S.GROUP_INDEX: np.arange(rows, dtype=np.int64) % PROMPTS,
                },
            )
            return NodeResult([key], rewrites_rows=True)
        if node.node_id == "reward":
            batch = self.buffer.get_many(ctx.input_keys(node.node_id))
            ids = np.array([batch[S.RESPONSE_IDS].row(i)[0] for i in range(batch.num_rows())])
            self.buffer.put(key, {S.REWARDS: (ids % 7).astype(np.float32)})
            return NodeResult([key])
        if node.node_id == "advantage":
            batch = self.buffer.get_many(ctx.input_keys(node.node_id))
            responses = batch[S.RESPONSE_IDS]
            values = responses.values.astype(np.float32) / 10.0 + np.repeat(
                np.asarray(batch[S.REWARDS], np.float32), responses.lengths()
            )
            self.buffer.put(key, {S.ADVANTAGES: Ragged(values, responses.offsets)})
            return NodeResult([key])
        if node.node_id == "actor_train":
            batch = self.buffer.get_many(ctx.input_keys(node.node_id))
            self.trained.append((ctx.step, dict(batch.columns)))
            return NodeResult([])
        raise AssertionError(f"unexpected node {node.node_id}")


@pytest.fixture(scope="module")
def buffer():
    with served_client("align") as client:
        yield client


_jobs = iter(range(10_000))


def run(sim: Sim, buffer, steps: int, eta: int) -> None:
    """The step loop as JobRunner drives it: consume, train, publish (version + 1), announce."""
    nodes = countdown_like()
    job = f"alignjob{next(_jobs)}"
    executor = StepExecutor(nodes, lambda n: sim, EventLog(job))
    plan = AsyncPlan(split_at_rollout(nodes), eta, (eta + 1) * PROMPTS, PROMPTS, "drop", "data_load")
    driver = AsyncSteps(executor, buffer, job, nodes, plan, threading.Event(), last_step=steps)
    driver.start(0, sim.fleet_version)
    version = sim.fleet_version
    try:
        for step in range(1, steps + 1):
            with driver.step_span(step):
                driver.run_step(step, version)
            version += 1
            sim.fleet_version = version  # published
            driver.announce(version)
    finally:
        driver.stop()
        driver.join()


@pytest.mark.parametrize("eta", [1, 2])
def test_every_trained_row_carries_its_own_columns(buffer, eta):
    sim = Sim(buffer)
    sim.update_mid_round = {2, 3}
    run(sim, buffer, steps=5, eta=eta)
    assert [step for step, _ in sim.trained] == [1, 2, 3, 4, 5]
    seen: set[int] = set()
    for _step, cols in sim.trained:
        responses = cols[S.RESPONSE_IDS]
        assert len(responses) == PROMPTS * N
        groups = np.asarray(cols[S.GROUP_INDEX])
        origin: dict[int, tuple[int, int]] = {}  # renumbered group -> (round, the rollout's group)
        for i in range(len(responses)):
            tokens = responses.row(i)
            uid = int(tokens[0])
            assert (tokens == uid).all() and len(tokens) == 1 + (uid % 100) % 3
            round_, row = divmod(uid, 100)
            np.testing.assert_array_equal(cols[S.ROLLOUT_LOGPROBS].row(i), logprobs_of(uid, len(tokens)))
            np.testing.assert_allclose(cols[S.ADVANTAGES].row(i), uid / 10.0 + uid % 7, rtol=1e-6)
            assert float(np.asarray(cols[S.REWARDS])[i]) == uid % 7
            versions = cols[S.RESPONSE_VERSIONS].row(i)
            assert len(versions) == len(tokens) and versions[-1] - versions[0] == int(
                round_ in sim.update_mid_round and len(tokens) > 1
            )
            assert origin.setdefault(int(groups[i]), (round_, row % PROMPTS)) == (round_, row % PROMPTS)
            assert uid not in seen  # no sample trained twice
            seen.add(uid)
        assert sorted(origin) == list(range(len(origin)))  # groups renumbered 0..G-1
    assert len(seen) == 5 * PROMPTS * N  # every sample of the 5 rounds trained, none dropped
