"""Rollout.ReleaseMemory / ResumeMemory over real gRPC (colocated mode's replica side): the replica reports its
resident memory before and after, gives up its weights' storage (a bigger model than the other rollout tests,
so the drop stands out of the process's noise), refuses an unknown tag with INVALID_ARGUMENT and changes
nothing then, and serves the same greedy tokens after its weights are resumed and refilled from disk."""

from __future__ import annotations

import grpc
import pytest
from _rollout_served import serve_replica
from safetensors.torch import load_file

from meshrl.api.common.v1 import weights_pb2
from meshrl.api.rollout.v1 import rollout_pb2 as pb
from meshrl.common import weights as W
from meshrl.rollout.replica import RolloutReplica
from meshrl.trainer.model_builder import build_small_model

MIB = 1 << 20


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """hidden 256, 4 layers: ~12 MiB of fp32 weights."""
    return build_small_model(
        tmp_path_factory.mktemp("mem-model"), hidden_size=256, num_layers=4, max_position_embeddings=64, seed=3
    )


@pytest.fixture
def stub(big_model, new_engine):
    with serve_replica(RolloutReplica(new_engine(big_model), replica_id="mem-0", capacity=8)) as served:
        yield served


def greedy(stub) -> list[int]:
    req = pb.GenerateRequest(prompt_ids=[3, 1, 4, 1, 5], sampling=pb.SamplingParams(max_tokens=6, ignore_eos=True))
    return [t for chunk in stub.GenerateStream(req, timeout=60) for t in chunk.token_ids]


def test_release_resume_and_refill_over_grpc(stub, big_model, tmp_path):
    before = greedy(stub)
    tensors = sorted(load_file(str(big_model / "model.safetensors")).items())
    weight_bytes = sum(t.numel() * t.element_size() for _, t in tensors)
    with pytest.raises(grpc.RpcError) as bad:
        stub.ReleaseMemory(pb.MemoryRequest(tags=["activations"]), timeout=30)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not among" in bad.value.details()
    assert greedy(stub) == before  # the refused call released nothing
    released = stub.ReleaseMemory(pb.MemoryRequest(), timeout=60)
    assert list(released.released) == ["kv_cache", "weights"]
    assert released.resident_bytes_before - released.resident_bytes_after > weight_bytes // 2 > 4 * MIB
    resumed = stub.ResumeMemory(pb.MemoryRequest(tags=["weights"]), timeout=60)
    assert list(resumed.released) == ["kv_cache"]
    pub = W.write_version(str(tmp_path / "w"), 1, tensors, fsync=False)
    disk = weights_pb2.DiskWeights(path=pub.path, version=1)
    assert stub.UpdateWeightsFromDisk(pb.UpdateWeightsFromDiskRequest(weights=disk), timeout=60).version == 1
    assert list(stub.ResumeMemory(pb.MemoryRequest(tags=["kv_cache"]), timeout=60).released) == []
    assert greedy(stub) == before  # the refilled weights serve the same tokens
