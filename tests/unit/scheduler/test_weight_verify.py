"""WeightPublisher.verify proves each replica serves the published version with the trainer's checksums: those
its update reply carried, else in one call per replica (the checksums reply carries the version the replica
serves, no GetStatus before it),
and a replica at another version or with other weights is a DataLoss that names it. A single replica loads a
published version from the calling thread (no pool thread per step); several load concurrently."""

from __future__ import annotations

import threading

import pytest

from meshrl.api.common.v1 import weights_pb2
from meshrl.api.rollout.v1 import rollout_pb2 as rpb
from meshrl.api.trainer.v1 import trainer_pb2 as tpb
from meshrl.common.errors import DataLoss, Unavailable
from meshrl.scheduler.config import WeightsSection
from meshrl.scheduler.fleet.weight_sync import WeightPublisher

SUMS = {"model.embed_tokens.weight": "aa", "lm_head.weight": "bb"}


class Replica:
    """The two calls verify could make, recorded; answers with `version` and `sums`."""

    def __init__(self, address: str, version: int, sums: dict[str, str]) -> None:
        self.address, self.version, self.sums = address, version, sums
        self.calls: list[str] = []

    def status(self, timeout: float = 30.0):
        self.calls.append("GetStatus")
        raise AssertionError("verify needs no status call")

    def checksums(self, names=()):
        self.calls.append("GetWeightChecksums")
        return weights_pb2.WeightChecksums(version=self.version, sha256={n: self.sums[n] for n in names})


def _publisher(version: int) -> WeightPublisher:
    publisher = WeightPublisher(trainer=None, cfg=WeightsSection(), disk_root="/unused")
    publisher.published_checksums = weights_pb2.WeightChecksums(version=version, sha256=SUMS)
    return publisher


def test_verify_makes_one_call_per_replica():
    replicas = [Replica("127.0.0.2:1", 3, SUMS), Replica("127.0.0.3:1", 3, SUMS)]
    _publisher(3).verify(replicas, 3)
    assert [r.calls for r in replicas] == [["GetWeightChecksums"], ["GetWeightChecksums"]]  # was: GetStatus first


def test_a_replica_at_another_version_or_with_other_weights_is_named():
    with pytest.raises(DataLoss, match=r"127.0.0.3:1 serves weight version 2, expected 3"):
        _publisher(3).verify([Replica("127.0.0.2:1", 3, SUMS), Replica("127.0.0.3:1", 2, SUMS)], 3)
    other = dict(SUMS, **{"lm_head.weight": "cc"})
    with pytest.raises(DataLoss, match=r"127.0.0.2:1 has different weights than the trainer for \['lm_head.weight'\]"):
        _publisher(3).verify([Replica("127.0.0.2:1", 3, other)], 3)


class Trainer:
    address = "127.0.0.4:1"

    def publish(self, req, timeout):
        disk = weights_pb2.DiskWeights(path="/unused/v3", version=req.version)
        return tpb.PublishWeightsResponse(
            disk=disk, bytes=10, checksums=weights_pb2.WeightChecksums(version=req.version, sha256=SUMS)
        )


class LoadingReplica(Replica):
    def __init__(self, address: str, fails: bool = False) -> None:
        super().__init__(address, 2, SUMS)
        self.fails, self.thread = fails, None

    def update_from_disk(self, disk, pause_mode, flush, timeout, checksum_names=()):
        """As the replica's server: the reply carries the checksums asked for, taken after the update."""
        self.thread = threading.current_thread()
        if self.fails:
            raise Unavailable("replica down")
        self.version = disk.version
        sums = weights_pb2.WeightChecksums(version=self.version, sha256={n: self.sums[n] for n in checksum_names})
        return rpb.UpdateWeightsResponse(version=self.version, checksums=sums if checksum_names else None)


def test_one_replica_loads_the_version_in_the_calling_thread_and_several_concurrently():
    one = LoadingReplica("127.0.0.2:1")
    publisher = WeightPublisher(Trainer(), WeightsSection(), "/unused")
    publisher.version = 2
    result = publisher.publish([one])
    assert result.version == 3 and result.stale == [] and one.version == 3
    assert one.thread is threading.current_thread()  # was: a pool thread started for the one call
    two = [LoadingReplica("127.0.0.2:1"), LoadingReplica("127.0.0.3:1", fails=True)]
    result = publisher.publish(two)
    assert result.stale == ["127.0.0.3:1"] and two[0].version == 4
    assert all(r.thread is not threading.current_thread() for r in two)
    down = LoadingReplica("127.0.0.2:1", fails=True)  # a failure of the inline call: stale, as from a pool thread
    assert publisher.publish([down]).stale == ["127.0.0.2:1"]


def test_the_update_reply_carries_the_checksums_so_verify_makes_no_call():
    publisher = WeightPublisher(Trainer(), WeightsSection(), "/unused")
    publisher.version = 2
    replicas = [LoadingReplica("127.0.0.2:1"), LoadingReplica("127.0.0.3:1")]
    assert publisher.publish(replicas).version == 3
    assert [r.calls for r in replicas] == [[], []]  # the update replies carried version and checksums
    other = LoadingReplica("127.0.0.3:1")
    other.sums = dict(SUMS, **{"lm_head.weight": "cc"})  # its reply's checksums differ: named, as from the call
    with pytest.raises(DataLoss, match=r"127.0.0.3:1 has different weights than the trainer for \['lm_head.weight'\]"):
        publisher.publish([other])
    assert other.calls == []


def test_a_reply_without_checksums_is_verified_by_a_call():
    class OlderReplica(LoadingReplica):  # a server that does not know checksum_names
        def update_from_disk(self, disk, pause_mode, flush, timeout, checksum_names=()):
            super().update_from_disk(disk, pause_mode, flush, timeout)
            return rpb.UpdateWeightsResponse(version=self.version)

    publisher = WeightPublisher(Trainer(), WeightsSection(), "/unused")
    older = OlderReplica("127.0.0.2:1")
    publisher.publish([older])
    assert older.calls == ["GetWeightChecksums"]
