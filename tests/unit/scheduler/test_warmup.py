"""The supervised warm-up (meshrl.scheduler.step.job.warmup) against a real trainer service over gRPC: its lr schedule,
held-out loss, epochs, and the hand-over to RL (a fresh optimizer, so RL's own lr schedule starts at its step 0)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pydantic
import pytest

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Batch, Ragged
from meshrl.common.errors import InvalidArgument, NotFound
from meshrl.common.grpc_server import ServerConfig, start_server
from meshrl.common.path_roots import PathRoots
from meshrl.scheduler.clients import TrainerClient
from meshrl.scheduler.config import OptimSection, WarmupSection
from meshrl.scheduler.step.job.lr_schedule import LrSchedule
from meshrl.scheduler.step.job.warmup import SupervisedWarmup, call_plan, schedule_for, warmup_steps
from meshrl.scheduler.step.prompts.data import PromptEncoder, Record
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.model_builder import build_small_model
from meshrl.trainer.server import service
from meshrl.trainer.service import TrainerService


class MemoryBuffer:
    """The data-buffer calls of the warm-up and the trainer (put / get / get_many / delete) over a dict."""

    def __init__(self) -> None:
        self.batches: dict[tuple, Batch] = {}

    @staticmethod
    def _k(key) -> tuple:
        return key.job_id, key.step, key.node_id

    def put(self, key, columns, **_) -> int:
        self.batches[self._k(key)] = Batch(dict(columns))
        return 0

    def get(self, key, **_) -> Batch:
        if self._k(key) not in self.batches:
            raise NotFound(f"no batch {self._k(key)}")
        return self.batches[self._k(key)]

    def get_many(self, keys, **_) -> Batch:
        (only,) = keys
        return self.get(only)

    def delete(self, key, **_) -> bool:
        return self.batches.pop(self._k(key), None) is not None

    def close(self) -> None:
        self.batches.clear()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_small_model(tmp_path_factory.mktemp("warm"), arch="qwen2", hidden_size=32, seed=3)


@pytest.fixture()
def trainer(model_dir):
    buffer = MemoryBuffer()
    cfg = TrainerConfig(paths=PathRoots(roots=[str(model_dir)]))  # the test's model
    running = start_server(ServerConfig(port=0), [service(TrainerService(cfg, TrainerCore(), buffer))])
    client = TrainerClient(running.address, timeout=120)
    yield client, buffer
    client.close()
    running.stop(0)


def records(n: int, offset: int = 0) -> list[Record]:
    out = []
    for i in range(offset, offset + n):
        digits = f"{(i * 7919) % 1000:03d}"
        out.append(Record(i, f"Reverse {digits}", digits[::-1], digits[::-1]))
    return out


RL_OPTIMIZER = OptimSection(lr=1e-3, decay_steps=10, decay_style="linear")


def warm(trainer, model_dir, tmp_path, **fields):
    client, buffer = trainer
    client.load_model("actor", str(model_dir), "float32", RL_OPTIMIZER, 0)
    cfg = WarmupSection(**{"steps": 12, "batch_size": 8, "lr": 1e-2, **fields})
    phase = SupervisedWarmup(
        "job",
        cfg,
        client,
        buffer,
        PromptEncoder(str(model_dir)),
        log=lambda _: None,
        micro_batch_tokens=4096,
        shuffle_seed=0,
    )
    result = phase.run(records(64), records(16, offset=500), tmp_path / "warmup.jsonl")
    phase.hand_over(str(model_dir), "float32", RL_OPTIMIZER, 0)
    return result, client, buffer


def rl_lr(client, buffer, model_dir) -> float:
    """The learning rate the trainer's own schedule gives the first RL-phase step (no lr_override)."""
    encoder, key = PromptEncoder(str(model_dir)), batch_key("job", 99, "rl")
    buffer.put(
        key,
        {
            S.PROMPT_IDS: Ragged.from_rows([encoder.encode_prompt("Reverse 123")], dtype=np.int32),
            S.RESPONSE_IDS: Ragged.from_rows([encoder.encode_response("321")], dtype=np.int32),
        },
    )
    return client.train_step("actor", [key], {"policy_loss": "sft"}, 4096, 1, 1).metrics["lr"]


def test_rl_schedule_starts_at_its_first_step_after_a_fresh_hand_over(trainer, model_dir, tmp_path):
    result, client, buffer = warm(trainer, model_dir, tmp_path)
    assert rl_lr(client, buffer, model_dir) == pytest.approx(1e-3)  # RL's schedule at step 0, not step 12


def test_keep_carries_the_warm_up_steps_into_rl_schedule(trainer, model_dir, tmp_path):
    """The old hand-over (one optimizer for both phases): RL's linear decay over 10 steps was already spent."""
    result, client, buffer = warm(trainer, model_dir, tmp_path, handover="keep")
    assert rl_lr(client, buffer, model_dir) == pytest.approx(0.0)


def test_schedule_held_out_loss_and_curve_file(trainer, model_dir, tmp_path):
    result, _, buffer = warm(trainer, model_dir, tmp_path, eval_every=6, warmup_ratio=0.25)
    lrs = [p["lr"] for p in result.curve]
    assert lrs[:3] == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2]) and lrs[-1] == pytest.approx(1e-2 / 9)
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:]))  # ramp over 3 steps, then linear decay
    held = [p["heldout_loss"] for p in result.curve if "heldout_loss" in p]
    assert len(held) == 2 and held[-1] < held[0] and result.heldout_loss == held[-1]
    written = [json.loads(x) for x in (tmp_path / "warmup.jsonl").read_text().splitlines()]
    assert [p["step"] for p in written] == list(range(1, 13)) and written[-1]["samples"] == 96
    assert not buffer.batches  # every warm-up batch deleted


def test_epochs_set_the_step_count():
    assert warmup_steps(WarmupSection(epochs=2, batch_size=8), 60) == 15
    assert warmup_steps(WarmupSection(steps=7), 60) == 7


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"steps": 5, "epochs": 1.0}, "set only one"),
        ({"lr": 1e-3, "min_lr": 1e-2}, "min_lr"),
        ({"schedule": "step"}, "schedule"),
        ({"handover": "copy"}, "handover"),
    ],
)
def test_bad_warm_up_config_is_refused_at_load(fields, words):
    with pytest.raises(pydantic.ValidationError, match=words):
        WarmupSection(**fields)


def test_lr_schedule_shapes_and_errors():
    lin = LrSchedule(peak=1.0, total_steps=4)
    assert [lin.at(i) for i in range(4)] == pytest.approx([1.0, 0.75, 0.5, 0.25])
    cos = LrSchedule(peak=1.0, total_steps=5, warmup_steps=1, decay="cosine", min_lr=0.1)
    assert cos.at(0) == 1.0 and cos.at(3) == pytest.approx(0.1 + 0.45 * (1 + np.cos(np.pi * 0.5)))
    assert LrSchedule(peak=2.0, total_steps=3, decay="constant").at(2) == 2.0
    for bad in ({"peak": 0.0}, {"warmup_steps": 9}, {"min_lr": 5.0}, {"decay": "step"}):
        with pytest.raises(InvalidArgument):
            LrSchedule(**{"peak": 1.0, "total_steps": 4, **bad})


def test_the_default_warm_up_ramps_to_its_peak_before_decaying():
    """A decaying warm-up ramps over its first half of the steps by default (issue 41: without a ramp, bench/vs_trl's
    `add` warm-up crossed its transition in about half of the data orders, with one in all); a constant one
    keeps its rate from the first step, and an explicit warmup_ratio wins."""

    def rates(**fields) -> list[float]:
        cfg = WarmupSection(**{"steps": 10, "lr": 1.0, **fields})
        return [schedule_for(cfg, 10).at(i) for i in range(10)]

    assert rates() == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2])  # ramp 5 steps, decay 5
    assert rates(schedule="cosine")[:6] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    assert rates(schedule="constant") == pytest.approx([1.0] * 10)
    assert rates(warmup_ratio=0.0)[:2] == pytest.approx([1.0, 0.9])


class StepTrainer:
    """A trainer whose call for steps [i, i + k) waits (up to 5 s) for the buffer to hold the next call's batches
    (stored under step i + k), and can fail at a step; it records each call's steps and rates."""

    def __init__(self, buffer: MemoryBuffer, fail_at: int = -1) -> None:
        self.buffer, self.fail_at, self.seen_ahead, self.calls = buffer, fail_at, [], []

    def train_step(self, role, keys, loss, micro_batch_tokens, mini_batches, step, step_lrs=()):
        lrs = list(step_lrs)
        assert len(self.buffer.get(keys[0])[S.PROMPT_IDS].lengths()) == 8 * len(lrs)  # the call's batches are there
        self.calls.append((step, lrs))
        if step <= self.fail_at < step + len(lrs):
            raise InvalidArgument("the trainer refused the batch")
        ahead = ("job", step + len(lrs), "warmup")
        deadline = time.monotonic() + 5.0
        while ahead not in self.buffer.batches and time.monotonic() < deadline:
            time.sleep(0.005)
        self.seen_ahead.append(ahead in self.buffer.batches)
        return SimpleNamespace(metrics={"loss": 1.0}, optimizer_steps=len(lrs), step_losses=[1.0] * len(lrs))


def run_phase(model_dir, trainer: StepTrainer, buffer: MemoryBuffer, steps: int = 4, **fields):
    cfg = WarmupSection(**{"steps": steps, "batch_size": 8, "steps_per_call": 1, **fields})
    phase = SupervisedWarmup(
        "job",
        cfg,
        trainer,
        buffer,
        PromptEncoder(str(model_dir)),
        log=lambda _: None,
        micro_batch_tokens=4096,
        shuffle_seed=0,
    )
    return phase.run(records(64), [])


def test_the_next_batch_is_stored_while_the_trainer_runs_a_step(model_dir):
    buffer = MemoryBuffer()
    trainer = StepTrainer(buffer)
    result = run_phase(model_dir, trainer, buffer)
    assert trainer.seen_ahead[:3] == [True, True, True]  # the last step has nothing ahead of it
    assert len(result.curve) == 4 and not buffer.batches  # every batch deleted after its step


def test_a_failed_step_leaves_no_batch_behind(model_dir):
    buffer = MemoryBuffer()
    with pytest.raises(InvalidArgument, match="refused"):
        run_phase(model_dir, StepTrainer(buffer, fail_at=1), buffer)
    assert not buffer.batches  # batch 1 and the batch stored ahead of it (2) are gone too


def test_calls_group_steps_and_end_where_an_evaluation_is_due():
    plan = call_plan(WarmupSection(steps=20, steps_per_call=4, eval_every=6, eval_accuracy_every=10), 20)
    assert [(r.start, r.stop) for r in plan] == [(0, 4), (4, 6), (6, 10), (10, 12), (12, 16), (16, 18), (18, 20)]
    assert [len(r) for r in call_plan(WarmupSection(steps=5, steps_per_call=8), 5)] == [5]


def test_several_steps_per_call_store_ahead_and_keep_each_steps_rate(model_dir):
    buffer = MemoryBuffer()
    trainer = StepTrainer(buffer)
    result = run_phase(model_dir, trainer, buffer, steps=10, steps_per_call=4, warmup_ratio=0.2)
    schedule = LrSchedule(peak=1e-3, total_steps=10, warmup_steps=2)
    assert [(first, len(lrs)) for first, lrs in trainer.calls] == [(0, 4), (4, 4), (8, 2)]
    assert [lr for _, lrs in trainer.calls for lr in lrs] == pytest.approx([schedule.at(i) for i in range(10)])
    assert trainer.seen_ahead[:2] == [True, True] and len(result.curve) == 10 and not buffer.batches
    seconds = [p["seconds"] for p in result.curve]
    assert all(a < b for a, b in zip(seconds, seconds[1:]))


def test_grouped_steps_train_as_one_call_per_step(trainer, model_dir, tmp_path):
    """Against the real trainer: 3 steps per call give the curve (each step's rate and loss) and held-out loss
    of one call per step."""
    (tmp_path / "one").mkdir(), (tmp_path / "grouped").mkdir()
    one, _, _ = warm(trainer, model_dir, tmp_path / "one", steps_per_call=1, eval_every=6)
    grouped, _, _ = warm(trainer, model_dir, tmp_path / "grouped", steps_per_call=3, eval_every=6)
    assert [p["lr"] for p in grouped.curve] == pytest.approx([p["lr"] for p in one.curve])
    assert [p["loss"] for p in grouped.curve] == pytest.approx([p["loss"] for p in one.curve], rel=1e-5)
    assert grouped.heldout_loss == pytest.approx(one.heldout_loss, rel=1e-5)
