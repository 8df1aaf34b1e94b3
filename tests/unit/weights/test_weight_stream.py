"""The CPU weight group's byte stream (stream.py): used only when every member offers it, tensors land in
their targets with no staging copy, strangers are turned away at set-up, and a broken stream fails its
waiters at once instead of at their deadline."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from _weights_workers import equal, make_tensors, zeros_like

from meshrl.common.net import free_port
from meshrl.common.weights import GroupPlan, InPlaceSink, WeightGroup, WeightGroupOptions
from meshrl.common.weights.stream import StreamOffer


@pytest.fixture
def pool():
    with ThreadPoolExecutor(max_workers=3) as p:
        yield p


def pair(pool, sender_options: WeightGroupOptions, receiver_options: WeightGroupOptions):
    plan = GroupPlan.build([("r", 1)], "127.0.0.1", free_port(), "t", "gloo", 10.0)
    receiver = pool.submit(WeightGroup.join, plan.replica_spec("r"), options=receiver_options)
    sender = WeightGroup.join(plan.sender, options=sender_options)
    return sender, receiver.result(30)


def test_tensors_land_in_the_parameters_themselves_with_nothing_staged(pool):
    sender, receiver = pair(pool, WeightGroupOptions(), WeightGroupOptions())
    assert sender.streaming and receiver.streaming
    export = make_tensors(1, scale=4)
    params = zeros_like(export)
    sink = InPlaceSink(params, 0)
    staged: list[str] = []
    apply = sink.apply
    sink.apply = lambda meta, tensors: (
        staged.extend(n for n, t in tensors if t.numel() and t.data_ptr() != params[n].data_ptr()),
        apply(meta, tensors),
    )
    for version in (1, 2):  # a second update reuses what the first built
        export = make_tensors(version, scale=4)
        future = pool.submit(receiver.receive, sink)
        assert sender.send(export, version).acked == (1,)
        assert future.result(30) == version and equal(params, export)
    assert staged == []  # every tensor was read straight into its parameter
    sender.destroy()
    receiver.destroy()


def one_update_then_leave(pool, sender, receiver) -> None:
    """Version 1 arrives bit-exact in the receiver's parameters; both members leave."""
    params = zeros_like(make_tensors(1))
    future = pool.submit(receiver.receive, InPlaceSink(params, 0))
    sender.send(make_tensors(1), 1)
    assert future.result(30) == 1 and equal(params, make_tensors(1))
    sender.destroy()
    receiver.destroy()


def test_a_member_that_asks_for_gloo_keeps_the_whole_group_on_gloo(pool):
    sender, receiver = pair(pool, WeightGroupOptions(), WeightGroupOptions(cpu_wire="gloo"))
    assert not sender.streaming and not receiver.streaming
    one_update_then_leave(pool, sender, receiver)


def _offers(store_port: int):
    host = dist.TCPStore("127.0.0.1", store_port, None, True, timedelta(seconds=10), wait_for_workers=False)
    guest = dist.TCPStore("127.0.0.1", store_port, None, False, timedelta(seconds=10))
    return StreamOffer(host, 0, 2, "127.0.0.1", None), StreamOffer(guest, 1, 2, "127.0.0.1", None), host


def test_strangers_are_turned_away_and_the_member_still_connects(pool):
    sender_offer, receiver_offer, store = _offers(free_port())
    host, port, _ = store.get("stream/addr").decode().split("|")
    wrong = socket.create_connection((host, int(port)))
    silent = socket.create_connection((host, int(port)))
    silent.close()  # hangs up without a word
    sending = pool.submit(sender_offer.connect, 10.0)
    assert len(wrong.recv(32)) == 32  # the sender's challenge
    wrong.sendall(b"\x01" + b"\x00" * 7 + b"not an HMAC of the challenge!!!!")  # rank 1, a wrong proof
    receiving = receiver_offer.connect(10.0)
    sending = sending.result(30)
    data = torch.arange(1 << 20, dtype=torch.int32)
    into = torch.zeros_like(data)
    works = receiving.start([into.view(torch.uint8)])
    sending.start([data.view(torch.uint8)])[0].wait(timedelta(seconds=30))
    works[0].wait(timedelta(seconds=30))
    assert torch.equal(into, data)
    assert wrong.recv(1) == b""  # the stranger was hung up on
    wrong.close()
    sending.close()
    receiving.close()


def test_a_closed_stream_fails_its_waiters_at_once(pool):
    sender_offer, receiver_offer, _ = _offers(free_port())
    sending = pool.submit(sender_offer.connect, 10.0)
    receiving = receiver_offer.connect(10.0)
    sending = sending.result(30)
    waiting = receiving.start([torch.zeros(1 << 20, dtype=torch.uint8)])[0]
    sending.start([torch.ones(1000, dtype=torch.uint8)])[0].wait(timedelta(seconds=30))  # part of the bytes
    start = time.monotonic()
    sending.close()  # the sender goes away mid-transfer
    with pytest.raises(RuntimeError, match="closed the stream after 1000 of"):
        waiting.wait(timedelta(seconds=30))
    assert time.monotonic() - start < 10
    with pytest.raises(RuntimeError, match="broke"):  # later work on a broken stream fails at once too
        receiving.start([torch.zeros(8, dtype=torch.uint8)])[0].wait(timedelta(seconds=30))
    receiving.close()


@pytest.mark.parametrize("sender_address", [None, "127.0.0.2"])
def test_members_on_distinct_hosts_stream_from_their_own_addresses(pool, sender_address):
    """Simulated hosts: the trainer at 127.0.0.2 (its bind address given or not), the replica bound to 127.0.0.3."""
    plan = GroupPlan.build([("r", 1)], "127.0.0.2", free_port(), "t", "gloo", 10.0)
    receiver = pool.submit(
        WeightGroup.join, plan.replica_spec("r"), options=WeightGroupOptions(local_address="127.0.0.3")
    )
    sender = WeightGroup.join(plan.sender, options=WeightGroupOptions(local_address=sender_address))
    receiver = receiver.result(30)
    assert sender.streaming and receiver.streaming
    (connection,) = sender._backend.stream._connections
    assert connection.sock.getpeername()[0] == "127.0.0.3"
    one_update_then_leave(pool, sender, receiver)


def test_every_member_decides_alike_to_stream_set_up_after_set_up(pool):
    """The offers are all posted before `connect`: the sender must see them every time (TCPStore.check of
    several keys at once sometimes said no, and the sender alone fell back to gloo)."""
    for _ in range(20):  # a wrong decision came in about 1 of 20 fresh stores
        sender_offer, receiver_offer, _store = _offers(free_port())
        sending = pool.submit(sender_offer.connect, 10.0)
        receiving = receiver_offer.connect(10.0)
        sending = sending.result(30)
        assert sending is not None and receiving is not None
        sending.close()
        receiving.close()
