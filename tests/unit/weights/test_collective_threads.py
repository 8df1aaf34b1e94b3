"""Collective transport in one process (sender and receiver on threads, gloo over loopback):
deadlines, aborts, refusals and the default process group left alone."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist
from _weights_workers import equal, make_tensors, zeros_like

from meshrl.common.errors import Aborted, DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable
from meshrl.common.net import free_port
from meshrl.common.weights import (
    CallbackSink,
    GroupPlan,
    InPlaceSink,
    MembersUnresponsive,
    UpdateRefused,
    WeightGroup,
    WeightGroupOptions,
)


@pytest.fixture
def pool():
    with ThreadPoolExecutor(max_workers=2) as p:
        yield p


def pair(pool, timeout=10.0, **options):
    plan = GroupPlan.build([("r", 1)], "127.0.0.1", free_port(), "t", "gloo", timeout)
    opts = WeightGroupOptions(**options)
    receiver = pool.submit(WeightGroup.join, plan.replica_spec("r"), options=opts)
    sender = WeightGroup.join(plan.sender, options=opts)
    return sender, receiver.result(30)


def test_update_and_default_group_untouched(pool):
    # a service's own data-parallel group (another test in this process may have made one already)
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    world, rank = dist.get_world_size(), dist.get_rank()
    try:
        sender, receiver = pair(pool, bucket_bytes=1024)
        params = zeros_like(make_tensors(1))
        got = pool.submit(receiver.receive, InPlaceSink(params, 0))
        assert sender.send(make_tensors(1), 1).acked == (1,)
        assert got.result(30) == 1 and equal(params, make_tensors(1))
        assert dist.get_world_size() == world and dist.get_rank() == rank
        with pytest.raises(FailedPrecondition, match="only rank 0 sends"):
            receiver.send(make_tensors(1), 2)
        with pytest.raises(FailedPrecondition, match="only rank 0 sends"):
            sender.receive(lambda v, b: None)
        sender.destroy()
        receiver.destroy()
        with pytest.raises(FailedPrecondition, match="unusable"):
            sender.send(make_tensors(1), 2)
    finally:
        if owned:
            dist.destroy_process_group()


ODD = [
    ("empty", torch.zeros(0, 3)),
    ("flag", torch.tensor([True, False, True])),
    ("i8", torch.arange(-3, 3, dtype=torch.int8)),
    ("strided", torch.arange(64.0).view(8, 8).t()),
    ("big", torch.arange(4096, dtype=torch.int32).view(64, 64)),
]


@pytest.mark.parametrize("layout, coalesce", [("per_tensor", 0), ("per_tensor", 256), ("flat", 0)])
@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("wire", ["stream", "gloo"])
def test_every_dtype_and_layout_arrives_bit_exact(pool, layout, coalesce, direct, wire):
    sender, receiver = pair(
        pool, coalesce_bytes=coalesce, stream_coalesce_bytes=coalesce, bucket_bytes=8192, cpu_wire=wire
    )
    assert sender.streaming == (wire == "stream")
    params = {n: torch.zeros_like(t).contiguous() for n, t in ODD}
    pointers = {n: p.data_ptr() for n, p in params.items()}
    future = pool.submit(receiver.receive, InPlaceSink(params, 0, direct=direct))
    assert sender.send(ODD, 1, layout_name=layout).acked == (1,)
    assert future.result(30) == 1 and equal(params, ODD)
    assert {n: p.data_ptr() for n, p in params.items()} == pointers
    sender.destroy()
    receiver.destroy()


def test_a_member_that_never_joins_is_named_within_the_deadline():
    plan = GroupPlan.build([("r", 1)], "127.0.0.1", free_port(), "t", "gloo", 30.0)
    start = time.monotonic()
    with pytest.raises(MembersUnresponsive, match="did not join") as err:
        WeightGroup.join(plan.sender, options=WeightGroupOptions(init_timeout_s=1.0))
    assert err.value.outcome.unresponsive == (1,) and time.monotonic() - start < 5


def test_trainer_store_unreachable_or_port_taken():
    plan = GroupPlan.build([("r", 1)], "127.0.0.1", free_port(), "t", "gloo", 1.0)
    with pytest.raises(DeadlineExceeded, match="could not reach"):
        WeightGroup.join(plan.replica_spec("r"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = GroupPlan.build([("r", 1)], "127.0.0.1", s.getsockname()[1], "t", "gloo", 1.0)
        with pytest.raises(Unavailable, match="free port"):
            WeightGroup.join(busy.sender)
    with pytest.raises(InvalidArgument, match="nccl"):
        WeightGroup.join(plan.sender.__class__(**{**plan.sender.__dict__, "backend": "nccl"}), device="cpu")


def test_no_update_started_is_a_deadline_and_the_group_stays_usable(pool):
    sender, receiver = pair(pool)
    with pytest.raises(DeadlineExceeded, match="sent nothing"):
        receiver.receive(lambda v, b: None, timeout=0.5)
    got = {}
    future = pool.submit(receiver.receive, CallbackSink(lambda v, b: got.update({n: t.clone() for n, t in b})))
    sender.send(make_tensors(2), 2, layout_name="per_tensor")
    assert future.result(30) == 2 and equal(got, make_tensors(2))
    sender.destroy()
    receiver.destroy()


def test_export_failure_aborts_cleanly_and_the_group_stays_usable(pool):
    sender, receiver = pair(pool, bucket_bytes=1024)
    sink = InPlaceSink(zeros_like(make_tensors(1)), 0)

    def broken_export():
        yield from make_tensors(1)[:3]
        raise RuntimeError("gather failed on tp rank 1")

    future = pool.submit(receiver.receive, sink)
    with pytest.raises(RuntimeError, match="gather failed"):
        sender.send(broken_export(), 1)
    with pytest.raises(Aborted, match="aborted update 1"):
        future.result(30)
    assert sink.touched and sink.version == 0  # partly applied: the replica must not serve it as v1
    future = pool.submit(receiver.receive, sink)
    assert sender.send(make_tensors(1), 1).acked == (1,) and future.result(30) == 1
    assert equal(sink.named_params, make_tensors(1)) and sink.version == 1
    sender.destroy()
    receiver.destroy()


def test_refusal_is_reported_to_the_sender_and_the_group_stays_usable(pool):
    sender, receiver = pair(pool)
    params = zeros_like(make_tensors(1))
    sink = InPlaceSink({n: p for n, p in params.items() if n != "lm_head.weight"}, 0)  # a model without lm_head
    future = pool.submit(receiver.receive, sink)
    with pytest.raises(UpdateRefused) as err:
        sender.send(make_tensors(1), 1)
    assert list(err.value.outcome.refused) == [1] and "unknown tensor 'lm_head.weight'" in err.value.outcome.refused[1]
    with pytest.raises(InvalidArgument):
        future.result(30)
    future = pool.submit(receiver.receive, lambda v, b: None)
    assert sender.send(make_tensors(2), 2).acked == (1,) and future.result(30) == 2
    sender.destroy()
    receiver.destroy()


def test_a_receiver_that_does_not_confirm_in_time_is_named(pool):
    sender, receiver = pair(pool, ack_timeout_s=1.0)

    class SlowToFinish(CallbackSink):
        def end(self, version: int) -> None:  # e.g. post-processing weights after the last bucket
            time.sleep(3.0)
            super().end(version)

    future = pool.submit(receiver.receive, SlowToFinish(lambda v, b: None))
    start = time.monotonic()
    with pytest.raises(MembersUnresponsive, match="did not confirm") as err:
        sender.send(make_tensors(1), 1)
    assert err.value.outcome.unresponsive == (1,) and time.monotonic() - start < 6
    assert sender.broken
    with pytest.raises(FailedPrecondition, match="unusable"):
        sender.send(make_tensors(1), 2)
    assert future.result(30) == 1  # the slow one still finished; the scheduler refits or re-groups it
    sender.destroy()
    receiver.destroy()


def test_a_trainer_that_goes_away_mid_update_fails_the_receiver(pool):
    sender, receiver = pair(pool, op_timeout_s=2.0, bucket_bytes=1024)
    sink = InPlaceSink(zeros_like(make_tensors(1)), 0)
    future = pool.submit(receiver.receive, sink)
    big = [(n, torch.zeros_like(t)) for n, t in make_tensors(1)]

    def stalls():
        yield from big[:2]
        sender._fail()  # the trainer process dies between two buckets
        yield from big[2:]

    with pytest.raises(Exception):  # noqa: B017 - the sender side fails in whatever way its backend reports
        sender.send(stalls(), 1)
    with pytest.raises((Unavailable, DeadlineExceeded), match="mark it stale"):
        future.result(30)
    assert receiver.broken and sink.touched
    sender.destroy()
    receiver.destroy()


def test_the_backend_carries_tensor_bytes_only_and_finished_updates_leave_no_keys(pool):
    sender, receiver = pair(pool)
    calls: list[list[int]] = []
    start = sender._backend.start

    def counted(tensors, deadline):
        if tensors:
            calls.append([t.numel() for t in tensors])
        return start(tensors, deadline)

    sender._backend.start = counted
    params = zeros_like(make_tensors(1))
    for version in (1, 2):
        future = pool.submit(receiver.receive, InPlaceSink(params, version - 1))
        sender.send(make_tensors(version), version, layout_name="flat")
        assert future.result(30) == version and equal(params, make_tensors(version))
    nbytes = sum(t.numel() * t.element_size() for _, t in make_tensors(1))
    # one broadcast per update, of the packed bucket alone: headers go through the store, and the
    # one bucket's header is both the announcement and the last header (no end marker)
    assert len(calls) == 2 and all(len(c) == 1 and c[0] >= nbytes for c in calls)
    store = sender._rdv.store
    sender._rdv._janitor.shutdown(wait=True)  # update 1's keys are deleted in the background
    assert not store.check(["update/1"]) and not store.check(["ack/1/1"])
    assert store.check(["update/2"]) and store.check(["ack/2/1"])
    assert not any(store.check([f"bucket/{u}/{i}"]) for u in (1, 2) for i in (0, 1))
    sender.destroy()
    receiver.destroy()


@pytest.mark.parametrize("layout", ["flat", "per_tensor"])
def test_a_dtype_or_shape_mismatch_is_refused_and_the_replica_is_unchanged(pool, layout):
    sender, receiver = pair(pool, coalesce_bytes=256)
    before = zeros_like(make_tensors(1))
    params = {n: t.clone() for n, t in before.items()}
    wrong = [(n, t.double() if n == "lm_head.weight" else t) for n, t in make_tensors(1)]
    wrong = [(n, t[:8] if n == "model.embed_tokens.weight" else t) for n, t in wrong]
    sink = InPlaceSink(params, 0)
    future = pool.submit(receiver.receive, sink)
    with pytest.raises(UpdateRefused) as err:
        sender.send(wrong, 1, layout_name=layout)
    why = err.value.outcome.refused[1]
    assert "'lm_head.weight' has dtype torch.float64" in why and "'model.embed_tokens.weight' has shape" in why
    with pytest.raises(InvalidArgument, match="nothing was changed"):
        future.result(30)
    assert equal(params, list(before.items())) and sink.version == 0 and not sink.touched
    sender.destroy()
    receiver.destroy()


def test_a_failure_marker_fails_the_waiting_receiver_at_once(pool):
    # what a sender posts when its broadcast broke: a receiver waiting for the next header stops now
    from meshrl.api.common.v1 import weights_pb2
    from meshrl.common.weights.wire import FAILED, encode_header

    sender, receiver = pair(pool, op_timeout_s=60.0)
    sink = InPlaceSink(zeros_like(make_tensors(1)), 0)
    future = pool.submit(receiver.receive, sink)
    start = time.monotonic()
    sender._rdv.announce(1, encode_header(FAILED, weights_pb2.WeightBucketMeta(version=7), 0, 0))
    with pytest.raises(Unavailable, match="trainer's side of the broadcast failed.*mark it stale"):
        future.result(30)
    assert time.monotonic() - start < 30 and receiver.broken and sink.version == 0  # far within 60 s
    sender.destroy()
    receiver.destroy()


def test_a_sender_that_leaves_first_stops_the_heartbeats_without_a_broken_pipe(pool, capfd):
    sender, receiver = pair(pool)
    future = pool.submit(receiver.receive, lambda v, b: None)
    sender.send(make_tensors(1), 1)
    assert future.result(30) == 1
    start = time.monotonic()
    sender.destroy()  # tells the heartbeats to stop and waits until they did
    assert time.monotonic() - start < 2.0
    time.sleep(0.6)  # two beats: a heartbeat still running would write to the closed store now
    receiver.destroy()
    assert "Broken pipe" not in capfd.readouterr().err
