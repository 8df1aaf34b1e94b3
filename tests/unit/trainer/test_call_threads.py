"""Per-call torch threads (call_threads.py): small calls run on one thread, large ones on the process's
setting, which is restored after every call, also one that raises."""

from __future__ import annotations

import pytest
import torch
from _worker import make_batch

from meshrl.common.errors import InvalidArgument
from meshrl.trainer.call_threads import FORWARD, call_flop, threads_for
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.losses import LossConfig
from meshrl.trainer.optim import OptimizerConfig

CPU = torch.device("cpu")


@pytest.fixture()
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_small_work_runs_on_one_thread_and_the_setting_comes_back(two_threads):
    with threads_for(0.5e9, 1.0, CPU) as used:
        assert used == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with threads_for(2e9, 1.0, CPU) as used:  # large work: every thread
        assert used == 2 and torch.get_num_threads() == 2
    with threads_for(1.0, 0.0, CPU) as used:  # 0 turns the rule off
        assert used == 2
    with pytest.raises(RuntimeError), threads_for(1.0, 1.0, CPU):
        raise RuntimeError("a failed call")
    assert torch.get_num_threads() == 2


def test_call_flop_counts_parameters_times_tokens():
    assert call_flop(1000, 50, FORWARD) == 100_000.0


def _threads_seen_by_the_model(core: TrainerCore) -> list[int]:
    seen: list[int] = []
    core.role("actor").model.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    return seen


def test_core_calls_pick_threads_by_their_work(qwen2_dir, two_threads):
    small = TrainerCore(single_thread_below_gflop=1.0)  # the tiny model's calls are far below 1 GFLOP
    small.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3))
    seen = _threads_seen_by_the_model(small)
    batch = make_batch(small.role("actor").spec.vocab_size)
    batch["old_logprobs"] = small.compute_logprobs("actor", batch).values
    small.train_step("actor", batch, LossConfig())
    assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    with pytest.raises(InvalidArgument):  # a refused call leaves the setting as it was
        small.train_step("actor", batch, LossConfig(), lr_override=-1.0)
    assert torch.get_num_threads() == 2

    every = TrainerCore(single_thread_below_gflop=0.0)
    every.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3))
    seen = _threads_seen_by_the_model(every)
    every.compute_logprobs("actor", batch)
    assert seen and set(seen) == {2}
