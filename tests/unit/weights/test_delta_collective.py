"""Delta versions over a weight group (delta_wire.py), sender and receiver on threads over gloo loopback:
bit-exact apply, a replica without the base refused and refitted with a complete version, the
max_fraction fallback, and that a complete version still pauses before its first tensor lands."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from meshrl.common.net import free_port
from meshrl.common.weights import (
    BaseMismatch,
    DeltaBase,
    DeltaOrFullSink,
    GroupPlan,
    InPlaceSink,
    UpdateRefused,
    WeightGroup,
    apply_delta,
    delta_update,
    tensor_checksums,
)


def model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(256, 64, generator=g).to(torch.bfloat16),
        "layer.0.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "norm.weight": torch.ones(64, dtype=torch.bfloat16),
    }


def step(tensors: dict[str, torch.Tensor], lr: float, seed: int = 1) -> dict[str, torch.Tensor]:
    """One sign-like optimizer step in fp32, rounded back to bf16 (as a trainer publishes it)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in tensors.items():
        update = torch.randn(t.shape, generator=g).sign() * lr
        out[name] = (t.float() * (1 - lr) - update).to(t.dtype) if name != "norm.weight" else t.clone()
    return out


@pytest.fixture
def group():
    plan = GroupPlan.build([("r", 1)], "127.0.0.1", free_port(), "t", "gloo", 20.0)
    with ThreadPoolExecutor(max_workers=2) as pool:
        receiver = pool.submit(WeightGroup.join, plan.replica_spec("r"))
        sender = WeightGroup.join(plan.sender)
        receiver = receiver.result(30)
        yield pool, sender, receiver
        sender.destroy()
        receiver.destroy()


def receive(pool, receiver, params, version):
    paused = []
    sink = DeltaOrFullSink(InPlaceSink(params, version), lambda: paused.append(True))
    return pool.submit(receiver.receive, sink), sink, paused


def full_send(pool, sender, receiver, base, params, tensors, version):
    future, sink, paused = receive(pool, receiver, params, version - 1)
    sender.send(base.record(version, tensors.items()), version)
    assert future.result(30) == version and paused == [True] and sink.staged is None
    return sink


def serving_v1(pool, sender, receiver):
    """Version 1 sent complete and kept as the trainer's base: (v1, the replica's parameters, the base)."""
    v1 = model()
    params = {n: torch.zeros_like(t) for n, t in v1.items()}
    base = DeltaBase()
    full_send(pool, sender, receiver, base, params, v1, 1)
    return v1, params, base


def test_delta_over_the_group_is_bit_exact_and_pauses_only_for_the_apply(group):
    pool, sender, receiver = group
    v1, params, base = serving_v1(pool, sender, receiver)
    v2 = step(v1, 1e-2)
    wire, stats = delta_update(base, 2, v2.items(), 0.5)
    assert wire is not None and 0 < stats.delta_bytes < stats.full_bytes * 0.5 and base.version == 2
    future, sink, paused = receive(pool, receiver, params, 1)
    sender.send(wire, 2)
    assert future.result(30) == 2 and paused == []  # received and decoded without pausing
    assert tensor_checksums(params, list(v1)) == tensor_checksums(v1, list(v1))  # nothing applied yet
    assert sink.staged is not None and {n for n, _ in sink.staged.tensors} == {"embed.weight", "layer.0.weight"}
    apply_delta(params, sink.staged)
    assert tensor_checksums(params, list(v2)) == tensor_checksums(v2, list(v2))
    assert all(torch.equal(params[n].view(torch.int16), v2[n].view(torch.int16)) for n in v2)


def test_a_replica_without_the_base_is_refused_and_refitted_in_full(group):
    pool, sender, receiver = group
    v1, v2 = model(), step(model(), 1e-2)
    params = {n: torch.zeros_like(t) for n, t in v1.items()}
    base = DeltaBase()
    list(base.record(1, v1.items()))  # the trainer published version 1, this replica missed it
    wire, _ = delta_update(base, 2, v2.items(), 0.5)
    future, sink, paused = receive(pool, receiver, params, 0)
    with pytest.raises(UpdateRefused) as refused:
        sender.send(wire, 2)
    assert list(refused.value.outcome.refused) == [1] and "refit" in refused.value.outcome.refused[1]
    with pytest.raises(BaseMismatch, match="delta against version 1, but this replica serves 0"):
        future.result(30)
    assert all(not p.any() for p in params.values()) and paused == []  # untouched
    full_send(pool, sender, receiver, base, params, v2, 2)  # the group stays usable: refit in full
    assert tensor_checksums(params, list(v2)) == tensor_checksums(v2, list(v2))


def test_weights_that_are_not_the_base_are_refused(group):
    pool, sender, receiver = group
    v1, params, base = serving_v1(pool, sender, receiver)
    params["layer.0.weight"][0, 0] += 1  # claims version 1, holds other bits
    wire, _ = delta_update(base, 2, step(v1, 1e-2).items(), 0.5)
    future, _, _ = receive(pool, receiver, params, 1)
    with pytest.raises(UpdateRefused):
        sender.send(wire, 2)
    with pytest.raises(BaseMismatch, match="not version 1's"):
        future.result(30)


def test_a_delta_above_max_fraction_goes_as_a_complete_version(group):
    pool, sender, receiver = group
    v1, params, base = serving_v1(pool, sender, receiver)
    v2 = step(v1, 0.5)  # most bits change
    wire, stats = delta_update(base, 2, v2.items(), 0.05)
    assert wire is None and stats.delta_bytes > 0.05 * stats.full_bytes and base.holds(2)
    full_send(pool, sender, receiver, base, params, dict(base.tensors), 2)
    assert tensor_checksums(params, list(v2)) == tensor_checksums(v2, list(v2))
