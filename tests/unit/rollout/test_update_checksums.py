"""A weight update's reply carries the checksums the scheduler verifies (UpdateWeightsRequest.checksum_names),
over real gRPC: the same the GetWeightChecksums call answers after the update, with the version they were
taken at, so verification needs no call of its own; none are computed when none are asked for."""

from __future__ import annotations

from _rollout_served import serve_replica
from safetensors.torch import load_file

from meshrl.api.common.v1 import weights_pb2
from meshrl.api.rollout.v1 import rollout_pb2 as pb
from meshrl.common import weights as W
from meshrl.rollout.replica import RolloutReplica


def test_the_update_reply_carries_the_checksums_asked_for(model_dir, new_engine, tmp_path):
    tensors = sorted(load_file(str(model_dir / "model.safetensors")).items())
    names = [tensors[0][0], tensors[-1][0]]
    pub = W.write_version(str(tmp_path / "w"), 1, [(n, t + 1.0) for n, t in tensors], fsync=False)
    disk = weights_pb2.DiskWeights(path=pub.path, version=1)
    with serve_replica(RolloutReplica(new_engine(model_dir), replica_id="sums-0", capacity=4)) as stub:
        reply = stub.UpdateWeightsFromDisk(
            pb.UpdateWeightsFromDiskRequest(weights=disk, checksum_names=names), timeout=60
        )
        asked = stub.GetWeightChecksums(pb.GetWeightChecksumsRequest(names=names), timeout=60)
        assert reply.version == 1 and reply.checksums.version == 1
        assert dict(reply.checksums.sha256) == dict(asked.sha256) and sorted(asked.sha256) == sorted(names)
        assert dict(reply.checksums.sha256) == {n: W.tensor_checksum(t + 1.0) for n, t in tensors if n in names}
        again = stub.UpdateWeightsFromDisk(pb.UpdateWeightsFromDiskRequest(weights=disk), timeout=60)
        assert again.version == 1 and not again.HasField("checksums")  # none asked for, none computed
