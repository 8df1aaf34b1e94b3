"""bench/async/run.py's own pieces: which overrides reach which mode, and the off-policy figures it prints."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[3] / "bench" / "async"
sys.path.insert(0, str(BENCH))  # run.py imports host_cpu beside it, as when run as a script
spec = importlib.util.spec_from_file_location("bench_async_run", BENCH / "run.py")
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)


def test_async_set_reaches_the_asynchronous_modes_only():
    a = run.parse_args(["--set", "eval.max_prompts=64", "--async-set", "algorithm.loss.clip_low=0.1"])
    assert run.overrides_for(a, "sync") == ["eval.max_prompts=64"]
    for mode in ("one_step_off", "async_eta1", "async_eta2"):
        assert run.overrides_for(a, mode) == ["eval.max_prompts=64", "algorithm.loss.clip_low=0.1"]


def test_off_policy_figures_average_the_steps_that_report_them():
    steps = [
        {"async/logprob_gap_lag0": 0.0, "actor/tis_weight": 1.0, "actor/clip_fraction": 0.1},
        {"async/logprob_gap_lag1": 0.2, "actor/tis_weight": 0.8, "actor/clip_fraction": 0.3},
        {"async/logprob_gap_lag1": 0.4, "actor/tis_weight": 0.9, "actor/clip_fraction": 0.2},
    ]
    got = run.off_policy_figures(steps)
    assert got["gap lag0"] == pytest.approx(0.0)
    assert got["gap lag1"] == pytest.approx(0.3)  # steps 2 and 3 only
    assert got["tis w"] == pytest.approx(0.9)
    assert got["clipped"] == pytest.approx(0.2)
    assert got["gap lag2"] is None and got["masked"] is None  # never reported: no figure rather than 0
    assert run.figure(None) == "-" and run.figure(0.25) == "0.2500"


def test_sync_from_takes_each_seeds_sync_run_of_an_earlier_out_file(tmp_path):
    saved = {"0": {"sync": {"final": 0.6}, "one_step_off": {"final": 0.5}}, "1": {"sync": {"final": 0.4}}}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(saved))
    assert run.earlier_sync(str(path), [0, 1]) == {0: {"final": 0.6}, 1: {"final": 0.4}}
    with pytest.raises(SystemExit, match=r"seed\(s\) \[2\]"):
        run.earlier_sync(str(path), [0, 2])


def test_async_eta0_runs_the_asynchronous_machinery_on_current_weights_only_when_asked(tmp_path):
    a = run.parse_args([])
    assert "async_eta0" not in a.modes.split(",")
    training = yaml.safe_load(run.job_yaml(a, "async_eta0", tmp_path, seed=1))["training"]
    assert training == {"mode": "async", "max_staleness": 0}


def test_the_sorting_example_in_the_disaggregated_placement(tmp_path):
    a = run.parse_args(["--example", "sorting", "--disaggregated"])
    cfg = yaml.safe_load(run.job_yaml(a, "one_step_off", tmp_path, seed=2))
    assert cfg["algorithm"]["reward"] == "examples.sorting.reward:score"
    assert cfg["services"]["cpu_placement"] == {"trainer_share": 1, "rollout_share": 1}
    assert cfg["job"]["seed"] == 2 and cfg["job"]["steps"] > 0  # the example's own steps without --steps
    assert "cpu_placement" not in yaml.safe_load(run.job_yaml(run.parse_args([]), "sync", tmp_path))["services"]


def test_idle_means_leave_out_the_step_whose_wall_holds_an_evaluation():
    steps = [{"step": 1}, {"step": 2, "eval/accuracy": 0.5}, {"step": 3}, {"step": 4}]
    assert [m["step"] for m in run.between_evals(steps)] == [1, 2, 4]
