"""WeightPublisher.verify proves each replica serves the published version with the trainer's checksums in
one call per replica: the checksums reply carries the version the replica serves (no GetStatus before it),
and a replica at another version or with other weights is a DataLoss that names it."""

from __future__ import annotations

import pytest

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import DataLoss
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
