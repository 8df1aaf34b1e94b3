"""The scheduler's weight group: backend by the members' devices (weights.backend), protocol and rank
offsets by the replicas' engines (weights.protocol): SGLang/vLLM servers join natively, one rank per
tensor-parallel worker; any other fleet uses meshrl's protocol, one rank per replica."""

from __future__ import annotations

import pytest

from meshrl.api.rollout.v1 import rollout_pb2 as rpb
from meshrl.common.errors import ConfigError
from meshrl.scheduler.config import WeightsSection
from meshrl.scheduler.fleet.weight_sync import group_layout


def status(engine: str, device: str, ranks: int = 1) -> rpb.RolloutStatus:
    return rpb.RolloutStatus(engine=engine, device=device, weight_ranks=ranks)


def test_cpu_fleet_is_gloo_and_meshrl():
    layout = group_layout(WeightsSection(), "cpu", [status("transformers", "cpu")] * 2)
    assert (layout.backend, layout.protocol, layout.offsets, layout.world_size) == ("gloo", "meshrl", (1, 2), 3)


def test_engine_servers_on_gpus_are_nccl_native_with_tp_ranks():
    layout = group_layout(WeightsSection(), "cuda:0", [status("sglang", "cuda", 2), status("vllm", "cuda", 1)])
    assert (layout.backend, layout.protocol, layout.offsets, layout.world_size) == ("nccl", "engine", (1, 3), 4)
    mixed = group_layout(WeightsSection(), "cuda:0", [status("sglang", "cuda", 2), status("transformers", "cuda:1")])
    assert mixed.protocol == "meshrl" and mixed.offsets == (1, 2)  # the SGLang adapter relays as one rank
    forced = group_layout(WeightsSection(protocol="meshrl"), "cuda:0", [status("sglang", "cuda", 4)])
    assert forced.protocol == "meshrl" and forced.world_size == 2


def test_nccl_with_a_cpu_member_names_the_field():
    with pytest.raises(ConfigError, match="weights.backend.*cpu"):
        group_layout(WeightsSection(backend="nccl"), "cpu", [status("sglang", "cuda", 1)])
    assert group_layout(WeightsSection(backend="gloo"), "cuda:0", [status("vllm", "cuda")]).backend == "gloo"


def test_deltas_only_to_a_group_whose_every_replica_applies_them():
    on = WeightsSection(delta=True)
    assert group_layout(on, "cpu", [status("transformers", "cpu")] * 2).deltas
    assert not group_layout(WeightsSection(), "cpu", [status("transformers", "cpu")]).deltas  # weights.delta off
    relayed = group_layout(on, "cuda:0", [status("sglang", "cuda", 2), status("transformers", "cuda:1")])
    assert relayed.protocol == "meshrl" and not relayed.deltas  # the SGLang adapter refuses every delta
    assert not group_layout(on, "cuda:0", [status("vllm", "cuda")]).deltas  # the engines' own wire: complete


def test_an_engine_group_is_sealed_only_when_every_replica_is_a_vllm_server():
    """meshrl's vLLM worker extension seals its group's store; SGLang's workers build theirs themselves."""
    assert group_layout(WeightsSection(), "cpu", [status("vllm", "cpu", 2), status("vllm", "cpu")]).sealed
    assert not group_layout(WeightsSection(), "cuda:0", [status("vllm", "cuda"), status("sglang", "cuda")]).sealed
    assert not group_layout(WeightsSection(), "cpu", [status("transformers", "cpu")]).sealed  # meshrl's protocol
