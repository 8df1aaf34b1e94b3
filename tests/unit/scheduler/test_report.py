"""The report's step-time chart (report.py): a step's bar is its wall time, split into each node's time and the
rest (it used to stack the step's total on top of its own parts, so every bar was about twice the step)."""

from __future__ import annotations

import json

import pytest

from meshrl.scheduler.report import REST, plot_step_times, step_parts
from meshrl.scheduler.rundir import RunDir


def test_a_steps_parts_are_its_nodes_and_the_rest_and_sum_to_the_step():
    parts = step_parts({"step": 1, "time/step": 10.0, "time/rollout": 6.0, "time/actor_train": 3.0, "reward/mean": 1})
    assert parts == {"actor_train": 3.0, "rollout": 6.0, REST: pytest.approx(1.0)}
    assert sum(parts.values()) == pytest.approx(10.0)


def test_nodes_that_ran_side_by_side_share_the_step():
    parts = step_parts({"time/step": 4.0, "time/old_logprob": 3.0, "time/advantage": 3.0})
    assert parts == {"advantage": 2.0, "old_logprob": 2.0, REST: 0.0}
    assert step_parts({"time/rollout": 1.0}) == {}  # no step time: nothing to split


def test_the_chart_is_drawn_from_the_parts(tmp_path):
    run = RunDir(tmp_path / "run")
    rows = [{"step": s, "time/step": 2.0 * s, "time/rollout": s, "time/actor_train": 0.5 * s} for s in (1, 2, 3)]
    run.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_step_times(run).stat().st_size > 0
