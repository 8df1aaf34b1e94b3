"""The asynchronous step pipeline over a real data buffer (gRPC + Redis streams), with simulated node work:
the DAG split at the rollout -> learner boundary, no trained sample older than eta over a whole run,
generation running ahead and then held back by a slow trainer (the stream's length stays within its bound),
a mid-generation weight update stamping a group with its oldest token version, cancel stopping both sides,
and the typed checks of `training` settings."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pydantic
import pytest
import redis

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Batch, Ragged
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.common.errors import Cancelled, InvalidArgument
from meshrl.databuffer.testing import SYSTEM_REDIS, config, delete_prefix, serving, unique_prefix
from meshrl.scheduler.config import TrainingSection
from meshrl.scheduler.events import EventLog
from meshrl.scheduler.step.executor import NodeResult, StepExecutor
from meshrl.scheduler.step.modes import AsyncPlan, plan_async, split_at_rollout
from meshrl.scheduler.step.pipeline import AsyncSteps, SyncSteps
from meshrl.scheduler.step.producer import split_groups
from meshrl.scheduler.step.staleness import AdmissionGate, logprob_gap_by_lag, staleness_histogram
from meshrl.scheduler.workflow import NodeRole, NodeType

PROMPTS = 3  # groups per round
N = 2  # samples per group


@dataclass
class Node:
    node_id: str
    node_type: NodeType
    node_role: NodeRole
    dependencies: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)


def grpo_like() -> list[Node]:
    T, R = NodeType, NodeRole
    return [
        Node("data", T.DATA_LOAD, R.DATA),
        Node("rollout", T.ROLLOUT, R.ROLLOUT, ["data"]),
        Node("reward", T.COMPUTE, R.REWARD, ["rollout"]),
        Node("old_logprob", T.MODEL_INFERENCE, R.ACTOR, ["reward"]),
        Node("advantage", T.COMPUTE, R.ADVANTAGE, ["old_logprob"]),
        Node("train", T.MODEL_TRAIN, R.ACTOR, ["advantage"]),
    ]


class Sim:
    """Node handlers: the rollout stamps each token with the fleet's version (changed mid-generation when
    `update_mid_round` says so); the trainer records what it trained on."""

    def __init__(self, buffer: DataBufferClient, rollout_s: float = 0.0, train_s: float = 0.0) -> None:
        self.buffer = buffer
        self.fleet_version = 1
        self.rollout_s, self.train_s = rollout_s, train_s
        self.trained: list[tuple[int, np.ndarray]] = []  # (trainer version, token versions of each row)
        self.trainer_version = 1
        self.update_mid_round: set[int] = set()
        self.loaded = 0  # rounds the data node loaded: the "data position"
        self.positions: list[str] = []  # what a checkpoint after each step would save

    def __call__(self, node, ctx) -> NodeResult:
        key = batch_key(ctx.job_id, ctx.step, node.node_id)
        if node.node_id == "data":
            self.loaded += 1
        if node.node_id == "rollout":
            time.sleep(self.rollout_s)
            first = self.fleet_version
            second = first + 1 if ctx.step in self.update_mid_round else first
            rows = [np.array([first, second, second], dtype=np.int64) for _ in range(PROMPTS * N)]
            self.buffer.put(key, {
                S.RESPONSE_IDS: Ragged.from_rows([np.array([5, 6, 7], dtype=np.int32)] * len(rows), dtype=np.int32),
                S.RESPONSE_VERSIONS: Ragged.from_rows(rows, dtype=np.int64),
                S.ROLLOUT_LOGPROBS: Ragged.from_rows([np.full(3, -1.0, np.float32)] * len(rows), dtype=np.float32),
                S.GROUP_INDEX: np.repeat(np.arange(PROMPTS), N).astype(np.int64),
                S.PROMPT_INDEX: np.full(len(rows), ctx.step, dtype=np.int64),
            })  # fmt: skip
            return NodeResult([key], {"rollout/samples": float(len(rows))}, rewrites_rows=True)
        if node.node_id == "old_logprob":
            rows = self.buffer.get_many(ctx.input_keys(node.node_id)).num_rows()
            self.buffer.put(key, {S.OLD_LOGPROBS: Ragged.from_rows([np.full(3, -1.5, np.float32)] * rows)})
            return NodeResult([key])
        if node.node_id == "train":
            time.sleep(self.train_s)
            batch = self.buffer.get_many(ctx.input_keys(node.node_id))
            self.trained.append((self.trainer_version, batch[S.RESPONSE_VERSIONS]))
            return NodeResult([])
        return NodeResult([])


@pytest.fixture(scope="module")
def buffer():
    prefix = unique_prefix("async")
    with serving(config(SYSTEM_REDIS, prefix)) as (_, running):
        client = DataBufferClient(running.address)
        yield client
        client.close()
    delete_prefix(redis.Redis.from_url(SYSTEM_REDIS), prefix)


_jobs = iter(range(10_000))


def run(sim: Sim, buffer, steps: int, eta: int | None, stream_groups: int = 0) -> tuple[list[dict], AsyncSteps]:
    """The step loop as JobRunner drives it: consume, train, publish (version + 1), announce."""
    nodes = grpo_like()
    job = f"asyncjob{next(_jobs)}"
    executor = StepExecutor(nodes, lambda n: sim, EventLog(job))
    if eta is None:
        driver = SyncSteps(executor, buffer, job, nodes)
    else:
        bound = stream_groups or (eta + 1) * PROMPTS
        plan = AsyncPlan(split_at_rollout(nodes), eta, bound, PROMPTS)
        driver = AsyncSteps(executor, buffer, job, nodes, plan, threading.Event(), lambda: str(sim.loaded), steps)
    driver.start(0, sim.fleet_version)
    out = []
    try:
        for step in range(1, steps + 1):
            with driver.step_span(step):
                metrics = driver.run_step(step, sim.trainer_version)
            sim.trainer_version += 1
            sim.fleet_version = sim.trainer_version  # published
            driver.finish_step(metrics)
            driver.announce(sim.trainer_version)
            sim.positions.append(driver.data_position())
            out.append(metrics)
    finally:
        driver.stop()
        driver.join()
    return out, driver


def test_split_at_the_rollout_boundary():
    split = split_at_rollout(grpo_like())
    assert split.producer == {"data", "rollout", "reward"}
    assert split.consumer == {"old_logprob", "advantage", "train"}
    assert split.boundary == ("reward",)
    no_rollout = [n for n in grpo_like() if n.node_id != "rollout"]
    no_rollout[1].dependencies = ["data"]
    with pytest.raises(InvalidArgument, match="needs a ROLLOUT node"):
        split_at_rollout(no_rollout)
    late = grpo_like()
    late[1].dependencies = ["data", "old_logprob"]
    late[3].dependencies = ["data"]
    with pytest.raises(InvalidArgument, match="depend on a trainer model node"):
        split_at_rollout(late)


@pytest.mark.parametrize("eta", [1, 2])
def test_no_trained_sample_is_older_than_eta_over_a_whole_run(buffer, eta):
    sim = Sim(buffer, train_s=0.05)
    sim.update_mid_round = {3}
    metrics, driver = run(sim, buffer, steps=6, eta=eta)
    assert len(sim.trained) == 6
    assert sim.positions == [str(k) for k in range(1, 7)]  # the consumed rounds', not the producer's, position
    assert sim.loaded == 6  # the producer ran ahead but not past the job's last step
    for version, token_versions in sim.trained:
        assert version - token_versions.values.min() <= eta  # every token of every trained row
    lags = [k for m in metrics for k, v in m.items() if k.startswith("async/staleness_") and k[-1].isdigit() and v]
    assert f"async/staleness_{eta}" in lags  # generation did run eta versions ahead
    assert all(m["async/dropped_groups"] == 0 for m in metrics)
    assert max(m["async/stream_groups_max"] for m in metrics) <= (eta + 1) * PROMPTS
    assert sum(m["async/staleness_" + k.rsplit("_", 1)[1]] for m in metrics for k in m
               if k.startswith("async/staleness_") and k[-1].isdigit()) == 6 * PROMPTS  # fmt: skip


def test_a_slow_trainer_holds_generation_back(buffer):
    sim = Sim(buffer, train_s=0.3)
    metrics, driver = run(sim, buffer, steps=4, eta=3, stream_groups=PROMPTS)
    assert max(m["async/stream_groups_max"] for m in metrics) == PROMPTS  # never more than one round waiting
    assert driver.gate.rollout_wait > 0.3  # the producer waited for room, it did not pile up
    assert metrics[-1]["async/rollout_idle_fraction"] > metrics[-1]["async/trainer_idle_fraction"]


def test_eta_zero_trains_what_sync_trains(buffer):
    sync_sim, async_sim = Sim(buffer), Sim(buffer)
    run(sync_sim, buffer, steps=3, eta=None)
    run(async_sim, buffer, steps=3, eta=0)
    assert [(v, r.values.tolist()) for v, r in async_sim.trained] == [
        (v, r.values.tolist()) for v, r in sync_sim.trained
    ]
    assert all(v - r.values.min() == 0 for v, r in async_sim.trained)


def test_cancel_stops_both_sides(buffer):
    sim = Sim(buffer, rollout_s=1.5)
    nodes = grpo_like()
    cancelled = threading.Event()
    driver = AsyncSteps(StepExecutor(nodes, lambda n: sim, EventLog("cancel")), buffer, "canceljob", nodes,
                        AsyncPlan(split_at_rollout(nodes), 1, 2 * PROMPTS, PROMPTS), cancelled)  # fmt: skip
    driver.start(0, 1)
    threading.Timer(0.3, cancelled.set).start()
    start = time.perf_counter()
    with pytest.raises(Cancelled):
        driver.run_step(1, 1)
    assert time.perf_counter() - start < 3.0
    driver.stop()
    driver.join()
    assert not driver.producer._thread.is_alive()


def test_a_stream_bound_below_one_round_is_refused():
    training = TrainingSection(mode="async", max_staleness=1, stream_groups=2)
    with pytest.raises(InvalidArgument, match="training.stream_groups = 2 is below one step's 3 groups"):
        plan_async(training, PROMPTS, grpo_like())
    plan = plan_async(TrainingSection(mode="one_step_off"), PROMPTS, grpo_like())
    assert (plan.eta, plan.stream_groups, plan.round_groups) == (1, 2 * PROMPTS, PROMPTS)


def test_a_group_carries_its_oldest_token_version():
    versions = Ragged.from_rows([np.array([4, 5]), np.array([5, 5]), np.array([6])], dtype=np.int64)
    batch = Batch({S.GROUP_INDEX: np.array([0, 0, 1]), S.RESPONSE_VERSIONS: versions})
    groups = split_groups(batch, 7, fallback_version=9)
    assert [(g.group_id, g.weight_version, g.batch.num_rows()) for g in groups] == [("r7-g0", 4, 2), ("r7-g1", 6, 1)]


def test_admission_gate_and_figures():
    gate = AdmissionGate(first_round=1, first_version=1, eta=1, stream_groups=4, round_groups=2)
    assert gate._admits(1) and gate._admits(2) and not gate._admits(3)  # 3 needs version 2
    gate.announce(2)
    assert gate._admits(3)
    gate.produced(1, 2, {}, 0.1)
    gate.produced(2, 2, {}, 0.1)
    assert not gate._admits(3)  # the stream is full
    ending = AdmissionGate(first_round=1, first_version=1, eta=2, stream_groups=9, round_groups=2, last_round=1)
    assert ending.admit(1) and not ending.admit(2)  # nothing past the job's last step
    ending.extend()  # ... unless a round was wholly dropped as stale
    assert ending.admit(2)
    assert staleness_histogram([0, 1, 1]) == {"async/staleness_0": 1.0, "async/staleness_1": 2.0,
                                              "async/staleness_max": 1.0}  # fmt: skip
    batch = Batch({
        S.OLD_LOGPROBS: Ragged.from_rows([np.array([-1.0, -2.0], np.float32)]),
        S.ROLLOUT_LOGPROBS: Ragged.from_rows([np.array([-1.5, -2.0], np.float32)]),
        S.RESPONSE_VERSIONS: Ragged.from_rows([np.array([3, 4], np.int64)]),
    })  # fmt: skip
    assert logprob_gap_by_lag(batch, 4) == {"async/logprob_gap_lag1": 0.5, "async/logprob_gap_lag0": 0.0}


@pytest.mark.parametrize(
    "values, message",
    [
        ({"mode": "async"}, "training.max_staleness is unset"),
        ({"mode": "one_step_off", "max_staleness": 2}, "does not fit training.mode = 'one_step_off'"),
        ({"mode": "sync", "max_staleness": 1}, "does not fit training.mode = 'sync'"),
        ({"mode": "later"}, "mode"),
        ({"mode": "async", "max_staleness": -1}, "max_staleness"),
    ],
)
def test_training_settings_are_checked(values, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        TrainingSection(**values)
    assert TrainingSection(mode="one_step_off").staleness == 1
    assert TrainingSection(mode="async", max_staleness=2).staleness == 2


def test_the_producers_spans_are_inside_the_consuming_step(buffer):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from meshrl.common.telemetry import TelemetryConfig, setup_telemetry, shutdown_telemetry

    exporter = InMemorySpanExporter()
    shutdown_telemetry()
    setup_telemetry("scheduler", TelemetryConfig(), span_exporter=exporter)
    try:
        run(Sim(buffer, train_s=0.05), buffer, steps=3, eta=1)
    finally:
        shutdown_telemetry()
    spans = exporter.get_finished_spans()
    roots = {s.name: s for s in spans if s.name.startswith("step ")}
    assert sorted(roots) == ["step 1", "step 2", "step 3"]
    for k in (1, 2, 3):
        trace_id = roots[f"step {k}"].context.trace_id
        nodes = {s.name for s in spans if s.context.trace_id == trace_id and s.name.startswith("node ")}
        assert nodes == {f"node {n.node_id}" for n in grpo_like()}  # producer's and consumer's nodes, one trace
    # round 2 was generated while step 1 trained: its step span starts before step 1 ends
    assert roots["step 2"].start_time < roots["step 1"].end_time
