"""Bucketing and flat layout of a bucket; group membership plans for the scheduler."""

from __future__ import annotations

import pytest
import torch
from _weights_workers import make_tensors

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import InvalidArgument
from meshrl.common.weights import GroupPlan, GroupSpec, WeightGroupOptions, iter_buckets
from meshrl.common.weights.buckets import ALIGN, bucket_specs, layout, pack, unpack
from meshrl.common.weights.wire import BucketLayout


def test_buckets_respect_the_size_and_keep_order():
    tensors = make_tensors(1, scale=8)  # two matrices of 2 KiB+ and small vectors
    buckets = list(iter_buckets(iter(tensors), bucket_bytes=4096))
    assert [n for b in buckets for n, _ in b] == [n for n, _ in tensors]
    for b in buckets:
        _, total = layout(bucket_specs(b))
        assert total <= 4096 or len(b) == 1  # a bigger tensor gets a bucket of its own
    with pytest.raises(InvalidArgument, match="twice"):
        list(iter_buckets([("a", torch.zeros(1)), ("a", torch.zeros(1))]))
    with pytest.raises(InvalidArgument):
        list(iter_buckets([], bucket_bytes=0))


def test_pack_and_unpack_round_trip_every_dtype_aligned():
    bucket = [
        *make_tensors(3),
        ("flag", torch.tensor([True, False])),
        ("ids", torch.arange(3, dtype=torch.int8)),
        ("empty", torch.zeros(0, 4)),
        ("strided", torch.arange(12.0).view(3, 4).t()),
    ]
    specs = bucket_specs(bucket)
    offsets, total = layout(specs)
    assert all(o % ALIGN == 0 for o in offsets)
    flat = pack(bucket, specs, torch.empty(total + 100, dtype=torch.uint8))
    out = unpack(flat, specs)
    assert [n for n, _ in out] == [n for n, _ in bucket]
    assert all(torch.equal(a, b) and a.dtype == b.dtype for (_, a), (_, b) in zip(out, bucket, strict=True))
    with pytest.raises(InvalidArgument):
        pack(bucket, specs, torch.empty(total - 1, dtype=torch.uint8))


def test_plan_offsets_replicas_of_and_replanning():
    plan = GroupPlan.build([("a", 1), ("b", 2), ("c", 1)], "10.0.0.1", 29500, "w", "nccl", 30.0)
    assert plan.sender.world_size == 5 and plan.sender.rank_offset == 0 and plan.offsets == [1, 2, 4]
    assert plan.replica_spec("b").rank_offset == 2 and plan.replica_spec("b").backend == "nccl"
    assert plan.replicas_of([0, 3, 4]) == ["b", "c"]
    fresh = plan.without(["b"], 29501, "w-2")
    assert fresh.sender.world_size == 3 and fresh.offsets == [1, 2] and fresh.replica_ids == ("a", "c")
    assert fresh.sender.master_port == 29501 and fresh.sender.group_name == "w-2"
    with pytest.raises(InvalidArgument):
        plan.without(["zz"], 1, "x")
    msg = plan.replica_spec("c").to_proto()
    assert isinstance(msg, weights_pb2.CollectiveGroup) and GroupSpec.from_proto(msg) == plan.replica_spec("c")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(world_size=1),
        dict(rank_offset=3),
        dict(backend="mpi"),
        dict(master_port=0),
        dict(timeout_s=0),
        dict(master_address=""),
    ],
)
def test_bad_specs_are_refused(kwargs):
    base = dict(master_address="127.0.0.1", master_port=1234, world_size=3, rank_offset=0)
    with pytest.raises(InvalidArgument):
        GroupSpec(**{**base, **kwargs})


def test_bad_options_are_refused():
    with pytest.raises(InvalidArgument):
        WeightGroupOptions(layout="zigzag")
    with pytest.raises(InvalidArgument):
        WeightGroupOptions(op_timeout_s=-1)


def test_by_default_only_tensors_under_512_kib_travel_packed():
    bucket = [(f"t{kib}", torch.zeros(kib * 512, dtype=torch.bfloat16)) for kib in (4, 128, 349, 511, 512, 4096)]
    lay = BucketLayout.of(bucket_specs(bucket), WeightGroupOptions().coalesce_bytes)
    assert [bucket[i][0] for i in lay.packed] == ["t4", "t128", "t349", "t511"]  # norms, small matrices: one buffer
    assert [bucket[i][0] for i in lay.direct] == ["t512", "t4096"]  # straight into the parameters
