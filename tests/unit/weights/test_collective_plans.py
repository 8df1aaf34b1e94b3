"""Collective transport, store traffic per update: the first header announces the update, the last
one ends it, and what each side built for an unchanged bucket is kept for the next update without
letting a changed bucket through unchecked (plans.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from _weights_workers import equal, make_tensors, zeros_like

from meshrl.common.errors import InvalidArgument
from meshrl.common.net import free_port
from meshrl.common.weights import GroupPlan, InPlaceSink, UpdateRefused, WeightGroup, WeightGroupOptions
from meshrl.common.weights.buckets import iter_buckets, marked_buckets


@pytest.fixture
def pool():
    with ThreadPoolExecutor(max_workers=2) as p:
        yield p


def pair(pool, **options):
    plan = GroupPlan.build([("r", 1)], "127.0.0.1", free_port(), "t", "gloo", 10.0)
    opts = WeightGroupOptions(**options)
    receiver = pool.submit(WeightGroup.join, plan.replica_spec("r"), options=opts)
    sender = WeightGroup.join(plan.sender, options=opts)
    return sender, receiver.result(30)


def headers(sender, seq: int) -> list[int]:
    """The indices of update <seq>'s bucket keys still in the store (bucket 0 rides in update/<seq>)."""
    return [i for i in range(1, 20) if sender._rdv.store.check([f"bucket/{seq}/{i}"])]


def test_buckets_know_whether_they_are_the_last_without_reading_ahead():
    tensors = make_tensors(1)
    marks = [last for _, last in marked_buckets(tensors, 1024)]
    assert len(marks) > 2 and marks[-1] and not any(marks[:-1])
    buckets = list(iter_buckets(tensors, 1024))
    assert [last for _, last in marked_buckets(buckets)] == marks  # a list of buckets: its length is known
    assert not any(last for _, last in marked_buckets(iter(buckets)))  # a lazy one: the end comes after it


def test_the_last_header_ends_the_update_and_a_lazy_export_gets_an_end_marker(pool):
    sender, receiver = pair(pool, bucket_bytes=1024)
    params = zeros_like(make_tensors(1))
    sink = InPlaceSink(params, 0)
    buckets = list(iter_buckets(make_tensors(1), 1024))
    future = pool.submit(receiver.receive, sink)
    sender.send(make_tensors(1), 1)
    assert future.result(30) == 1 and equal(params, make_tensors(1))
    assert headers(sender, 1) == list(range(1, len(buckets)))  # no end marker after the last bucket
    lazy = list(iter_buckets(make_tensors(2), 1024))
    future = pool.submit(receiver.receive, sink)
    sender.send(iter(lazy), 2)  # buckets from a generator: the sender learns the end after the last one
    assert future.result(30) == 2 and equal(params, make_tensors(2))
    assert headers(sender, 2) == list(range(1, len(buckets) + 1))  # ... and posts an end marker
    sender.destroy()
    receiver.destroy()


def test_an_unchanged_bucket_reuses_the_receivers_plan_and_a_changed_one_is_checked_again(pool):
    sender, receiver = pair(pool, coalesce_bytes=256)
    params = zeros_like(make_tensors(1))
    sink = InPlaceSink(params, 0)
    seen = []
    apply = sink.apply
    sink.apply = lambda meta, tensors: (seen.append(meta), apply(meta, tensors))
    for version, layout in ((1, "per_tensor"), (2, "flat"), (3, "per_tensor"), (4, "flat")):
        future = pool.submit(receiver.receive, sink)
        sender.send(make_tensors(version), version, layout_name=layout)  # receivers follow each layout
        assert future.result(30) == version and equal(params, make_tensors(version))
    assert all(m is seen[0] for m in seen) and seen[0].version == 4  # one checked meta, this update's version
    wrong = [(n, t[:8] if n == "model.embed_tokens.weight" else t) for n, t in make_tensors(5)]
    future = pool.submit(receiver.receive, sink)
    with pytest.raises(UpdateRefused) as err:
        sender.send(wrong, 5)
    assert "'model.embed_tokens.weight' has shape [8, 16]" in err.value.outcome.refused[1]
    with pytest.raises(InvalidArgument, match="nothing was changed"):
        future.result(30)
    assert equal(params, make_tensors(4)) and sink.version == 4
    future = pool.submit(receiver.receive, sink)
    with pytest.raises(UpdateRefused):  # a new dtype: checked again, not reused
        sender.send([(n, t.double()) for n, t in make_tensors(6)], 6)
    with pytest.raises(InvalidArgument, match="has dtype torch.float64"):
        future.result(30)
    sender.destroy()
    receiver.destroy()


def test_a_kept_bucket_whose_names_came_earlier_in_the_update_is_refused_as_sent_twice(pool):
    sender, receiver = pair(pool)
    sink = InPlaceSink(zeros_like(make_tensors(1)), 0)
    first, second = make_tensors(1)[:3], make_tensors(1)[3:]
    future = pool.submit(receiver.receive, sink)
    sender.send([first, second], 1)
    assert future.result(30) == 1
    future = pool.submit(receiver.receive, sink)
    with pytest.raises(UpdateRefused):  # bucket 1 is unchanged (kept), but bucket 0 already held its names
        sender.send([first + second, second], 2)
    with pytest.raises(InvalidArgument, match="sent twice"):
        future.result(30)
    sender.destroy()
    receiver.destroy()


@pytest.mark.parametrize("wire", ["gloo", "stream"])
def test_small_tensors_travel_in_chunks_and_empty_ones_still_arrive(pool, wire):
    from meshrl.common.weights.buckets import bucket_specs
    from meshrl.common.weights.wire import PACK_CHUNK_BYTES, BucketLayout

    small = [(f"s{i}", torch.full((100_000,), float(i))) for i in range(30)]  # 400 KB each, 12 MB in all
    empty = [("e0", torch.zeros(0)), ("e1", torch.zeros(0, 4))]
    lay = BucketLayout.of(bucket_specs(small + empty), 512 << 10)
    sizes = [stop - start for _, _, start, stop in lay.chunks]
    assert len(sizes) > 2 and sum(sizes) == lay.packed_total and max(sizes) < PACK_CHUNK_BYTES + (512 << 10)
    assert [i for first, end, _, _ in lay.chunks for i in lay.packed[first:end]] == list(lay.packed)
    sender, receiver = pair(pool, cpu_wire=wire, stream_coalesce_bytes=512 << 10)
    assert sender.streaming == receiver.streaming == (wire == "stream")
    # every chunk is applied as it arrives; a bucket of empty tensors only has no chunk, one apply
    for export, applies in ((small + empty, len(sizes)), (empty, 1)):
        params = zeros_like(export)
        calls: list[int] = []
        sink = InPlaceSink(params, 0)
        sink.apply = lambda meta, tensors, calls=calls, apply=sink.apply: (
            calls.append(len(tensors)),
            apply(meta, tensors),
        )
        future = pool.submit(receiver.receive, sink)
        sender.send(export, 1)
        assert future.result(30) == 1 and equal(params, export)
        assert sum(calls) == len(export) and len(calls) == applies
    sender.destroy()
    receiver.destroy()
