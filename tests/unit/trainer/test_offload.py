"""Colocated mode's trainer offload (meshrl.trainer.offload) on a real megatron-core actor with Adam state: it
finds the torch optimizer inside Megatron's wrapper and walks every state tensor; on this CPU trainer the state
already lives in host memory, so offload and onload move nothing (0 bytes) and training goes on exactly as
without them. Moving the same state to another device (the meta device stands in for CUDA here) counts every
byte of Adam's two moments."""

from __future__ import annotations

import torch
from _worker import make_batch

from meshrl.trainer.core import TrainerCore
from meshrl.trainer.offload import move_optimizer_state, set_residency, torch_optimizers
from meshrl.trainer.optim import OptimizerConfig


def actor(qwen2_dir) -> TrainerCore:
    core = TrainerCore(micro_batch_tokens=4096)
    core.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3))
    return core


def test_cpu_offload_moves_nothing_and_training_is_unchanged(qwen2_dir):
    plain, offloaded = actor(qwen2_dir), actor(qwen2_dir)
    batch = make_batch(plain.role("actor").spec.vocab_size)
    losses = {id(plain): [], id(offloaded): []}
    for _ in range(2):
        for core in (plain, offloaded):
            losses[id(core)].append(core.train_step("actor", batch).metrics["loss"])
        out = set_residency(offloaded.roles.values(), offloaded.device, resident=False)
        back = set_residency(offloaded.roles.values(), offloaded.device, resident=True)
        assert (out["bytes"], out["device"], back["bytes"], back["device"]) == (0, "cpu", 0, "cpu")
    assert losses[id(plain)] == losses[id(offloaded)]


def test_the_walk_counts_every_byte_of_adams_moments(qwen2_dir):
    core = actor(qwen2_dir)
    core.train_step("actor", make_batch(core.role("actor").spec.vocab_size))  # Adam has state now
    optimizer = core.role("actor").optimizer
    inner = list(torch_optimizers(optimizer))
    assert inner and all(isinstance(o, torch.optim.Optimizer) for o in inner)
    params = sum(p.numel() for o in inner for g in o.param_groups for p in g["params"])
    moved = move_optimizer_state([optimizer], torch.device("meta"))
    assert moved >= 2 * 4 * params  # exp_avg and exp_avg_sq in fp32 (plus Adam's step counters)
    states = [v for o in inner for s in o.state.values() for v in s.values() if torch.is_tensor(v)]
    assert states and all(v.device.type == "meta" for v in states)
