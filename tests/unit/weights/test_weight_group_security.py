"""A secured weight group (the members share a service token): members prove it to each other over the CPU
stream (an HMAC over a fresh challenge), so a stranger on another loopback address who reads the group's store
can neither take a receiver's place nor read the model, a member with another token cannot join, headers forged
into the store are refused, the stream binds only its address, and the sender's set-up has one deadline however
many strangers call."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from _weights_workers import equal, make_tensors, zeros_like

from meshrl.common.errors import DataLoss, InvalidArgument, PermissionDenied
from meshrl.common.net import free_port
from meshrl.common.weight_group_secret import mac
from meshrl.common.weights import GroupPlan, InPlaceSink, WeightGroup, WeightGroupOptions
from meshrl.common.weights.stream import StreamOffer, StreamRefused, _listen

SECRET = "the-service-token"


@pytest.fixture
def pool():
    with ThreadPoolExecutor(max_workers=3) as p:
        yield p


def _plan():
    return GroupPlan.build([("r", 1)], "127.0.0.2", free_port(), "t", "gloo", 10.0)


def test_members_with_the_token_stream_and_forged_headers_are_refused(pool):
    plan = _plan()
    receiver = pool.submit(
        WeightGroup.join, plan.replica_spec("r"), options=WeightGroupOptions(local_address="127.0.0.3", secret=SECRET)
    )
    sender = WeightGroup.join(plan.sender, options=WeightGroupOptions(local_address="127.0.0.2", secret=SECRET))
    receiver = receiver.result(30)
    assert sender.streaming and receiver.streaming
    params = zeros_like(make_tensors(1))
    future = pool.submit(receiver.receive, InPlaceSink(params, 0))
    assert sender.send(make_tensors(1), 1).acked == (1,)
    assert future.result(30) == 1 and equal(params, make_tensors(1))
    sender._rdv.store.set("update/2", b"\x00" * 64)  # a stranger's header for the next update
    with pytest.raises(DataLoss, match="not signed with the service token"):
        receiver.receive(InPlaceSink(params, 0), timeout=10)
    sender.destroy()
    receiver.destroy()


def test_a_member_with_another_token_cannot_join(pool):
    plan = _plan()
    receiver = pool.submit(
        WeightGroup.join,
        plan.replica_spec("r"),
        options=WeightGroupOptions(local_address="127.0.0.3", secret="another token"),
    )
    with pytest.raises(PermissionDenied, match=r"ranks \[1\] did not prove the service token"):
        WeightGroup.join(plan.sender, options=WeightGroupOptions(local_address="127.0.0.2", secret=SECRET))
    with pytest.raises(PermissionDenied, match="do not share the service token.*refused \\[1\\]"):
        receiver.result(30)


def _offers(secret: str | None):
    port = free_port()
    host = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10), wait_for_workers=False)
    guest = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10))
    sender = StreamOffer(host, 0, 2, "127.0.0.2", "127.0.0.2", secret)
    receiver = StreamOffer(guest, 1, 2, "127.0.0.2", "127.0.0.3", secret)
    return sender, receiver, host


def test_a_stranger_who_reads_the_store_cannot_take_a_receivers_place(pool):
    sender_offer, receiver_offer, store = _offers(SECRET)
    host, port, nonce = store.get("stream/addr").decode().split("|")  # all a stranger can learn from the store
    stranger = socket.create_connection((host, int(port)), source_address=("127.0.0.4", 0))
    sending = pool.submit(sender_offer.connect, 10.0)
    challenge = stranger.recv(32)
    stranger.sendall((1).to_bytes(8, "little") + mac(nonce.encode(), "member", nonce, 1, challenge))  # as rank 1
    receiving = receiver_offer.connect(10.0)
    sending = sending.result(30)
    data = torch.arange(1 << 18, dtype=torch.int32)
    into = torch.zeros_like(data)
    works = receiving.start([into.view(torch.uint8)])
    sending.start([data.view(torch.uint8)])[0].wait(timedelta(seconds=30))
    works[0].wait(timedelta(seconds=30))
    assert torch.equal(into, data)
    stranger.settimeout(10)
    assert stranger.recv(1 << 20) == b""  # hung up on: not one byte of the tensor
    stranger.close()
    sending.close()
    receiving.close()


def test_the_sender_set_up_has_one_deadline_however_many_strangers_call(pool):
    sender_offer, _receiver_offer, store = _offers(SECRET)
    host, port, _ = store.get("stream/addr").decode().split("|")
    stop = threading.Event()

    def pester() -> None:  # a new silent caller every 0.2 s: each would restart a per-accept timeout
        held = []
        while not stop.is_set():
            held.append(socket.create_connection((host, int(port)), source_address=("127.0.0.4", 0)))
            time.sleep(0.2)
        for sock in held:
            sock.close()

    pestering = pool.submit(pester)
    started = time.monotonic()
    with pytest.raises(OSError, match="did not connect to the weight stream"):
        sender_offer.connect(2.0)
    assert time.monotonic() - started < 4.0
    stop.set()
    pestering.result(10)


def test_a_secured_stream_binds_only_its_address_and_refuses_gloo():
    with pytest.raises(StreamRefused, match="weights.group_address"):
        _listen("192.0.2.1", "192.0.2.1", strict=True)  # not an address of this host: no wildcard fallback
    with pytest.raises(InvalidArgument, match="cpu_wire 'stream'"):
        WeightGroupOptions(cpu_wire="gloo", secret=SECRET)
