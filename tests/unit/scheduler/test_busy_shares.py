"""Each side's busy share of a step (`busy/trainer`, `busy/rollout`) and its idle fraction: the trainer nodes'
and the rollout's seconds over the wall time since the previous step ended, capped at 1, in sync mode from the
node timings the step's DAG reports."""

from __future__ import annotations

import pytest

from meshrl.scheduler.step.pacing import pipeline
from meshrl.scheduler.step.pacing.pipeline import IdleMeter, SyncSteps
from meshrl.scheduler.workflow import NodeRole, NodeType
from tests.unit.scheduler._step_nodes import Node


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(pipeline.time, "perf_counter", c)
    return c


def test_busy_shares_are_each_sides_seconds_over_the_wall_since_the_last_step(clock):
    meter = IdleMeter()
    clock.now += 4.0
    first = meter.fractions(trainer_busy=1.0, rollout_total=3.0)
    assert first == {
        "busy/trainer": 0.25,
        "busy/rollout": 0.75,
        "async/trainer_idle_fraction": 0.75,
        "async/rollout_idle_fraction": 0.25,
    }
    clock.now += 2.0  # the rollout's total grows by 1 s over the next 2 s: only that counts
    second = meter.fractions(trainer_busy=2.0, rollout_total=4.0)
    assert (second["busy/trainer"], second["busy/rollout"]) == (1.0, 0.5)
    clock.now += 1.0  # a producer that generated for longer than the wall (it ran before the interval): at most 1
    third = meter.fractions(trainer_busy=0.0, rollout_total=6.0)
    assert (third["busy/rollout"], third["async/rollout_idle_fraction"], third["busy/trainer"]) == (1.0, 0.0, 0.0)


class TimedExecutor:
    """Reports node seconds as a step's DAG does, and lets the clock run for the step's length."""

    def __init__(self, clock: Clock, seconds: dict[str, float]) -> None:
        self.clock, self.seconds = clock, seconds

    def run_nodes(self, job_id, step, version=0, **_):
        self.clock.now += sum(self.seconds.values()) + 0.5  # plus what no node accounts for
        return {f"time/{k}": v for k, v in self.seconds.items()}, {}


def test_a_sync_step_reports_generation_and_training_as_shares_of_its_wall(clock):
    T, R = NodeType, NodeRole
    nodes = [
        Node("data", T.DATA_LOAD, R.DATA),
        Node("rollout", T.ROLLOUT, R.ROLLOUT, ["data"]),
        Node("reward", T.COMPUTE, R.REWARD, ["rollout"]),
        Node("train", T.MODEL_TRAIN, R.ACTOR, ["reward"]),
    ]
    steps = SyncSteps(TimedExecutor(clock, {"rollout": 1.5, "reward": 0.5, "train": 2.5}), None, "job", nodes)
    steps.start(0, 0)
    for step in (1, 2):
        metrics = steps.run_step(step, step - 1)
        steps.finish_step(metrics)
        assert metrics["busy/rollout"] == pytest.approx(1.5 / 5.0)
        assert metrics["busy/trainer"] == pytest.approx(2.5 / 5.0)
        assert metrics["async/trainer_idle_fraction"] == pytest.approx(0.5)
