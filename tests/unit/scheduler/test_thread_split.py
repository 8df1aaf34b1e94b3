"""training.split_threads: in the overlapped modes a CPU trainer launched by the job gets the cores its
replicas leave (torch_threads), so that generation and training do not oversubscribe the host; sync, eta 0, GPUs,
`split_threads: false` and the job's own trainer torch_threads keep what they had."""

from __future__ import annotations

import os

import pytest

from meshrl.common.config import load_config
from meshrl.common.errors import ConfigError
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.launch.launcher import overlapped_trainer_threads
from meshrl.scheduler.launch.services import trainer_spec
from meshrl.scheduler.rundir import RunDir


def threads_set(tmp_path, *overrides: str) -> list[str]:
    cfg = load_config(JobConfig, env={}, overrides=["model.path=m", "data.train=t.jsonl", *overrides])
    args = trainer_spec(cfg, RunDir(tmp_path), "trainer", "127.0.0.1:1", str(tmp_path)).args
    return [v for k, v in zip(args, args[1:]) if k == "--set" and v.startswith("torch_threads=")]


def test_the_trainer_gets_the_cores_the_replicas_leave():
    assert overlapped_trainer_threads(2, 1) == 1
    assert overlapped_trainer_threads(16, 2) == 14
    assert overlapped_trainer_threads(16, 2, ranks=4) == 3
    assert overlapped_trainer_threads(2, 4) == 1  # never none


def test_only_overlapped_cpu_jobs_split_threads(tmp_path):
    expected = f"torch_threads={overlapped_trainer_threads(os.cpu_count() or 1, 1)}"
    assert threads_set(tmp_path) == []  # sync: the trainer runs alone, on every core
    assert threads_set(tmp_path, "training.mode=async", "training.max_staleness=0") == []  # nothing overlaps
    for mode in (["training.mode=one_step_off"], ["training.mode=async", "training.max_staleness=2"]):
        assert threads_set(tmp_path, *mode) == [expected]
        assert threads_set(tmp_path, *mode, "training.split_threads=false") == []
        assert threads_set(tmp_path, *mode, "trainer.gpus=1") == []
        # the job's own setting comes last, so the trainer's config loader keeps it
        assert threads_set(tmp_path, *mode, 'trainer.service_overrides=["torch_threads=2"]') == [
            expected,
            "torch_threads=2",
        ]
    with pytest.raises(ConfigError, match="training.split_threads"):
        load_config(JobConfig, env={}, overrides=["model.path=m", "data.train=t.jsonl", "training.split_threads=half"])
