"""Rank 0 greets every caller of the weight stream at once: a silent caller that came first, or a crowd of
them, does not delay a member's admission (each greeting waits for its own caller only, here far longer than
the whole join deadline, so greeting one at a time could not admit anyone); a caller that sends half a hello
or a wrong one is dropped; greetings beyond the cap are hung up on at once; callers still greeting when the
members are in are hung up on."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from meshrl.common.net import free_port
from meshrl.common.weights import stream_admission
from meshrl.common.weights.stream import StreamOffer

SECRET = "the-service-token"


def _offers(world_size: int = 2):
    """Rank 0 on 127.0.0.2 and its receivers on 127.0.0.3, .5, ...; the store they share."""
    port = free_port()
    host = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10), wait_for_workers=False)
    sender = StreamOffer(host, 0, world_size, "127.0.0.2", "127.0.0.2", SECRET)
    receivers = []
    for rank in range(1, world_size):
        guest = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10))
        receivers.append(StreamOffer(guest, rank, world_size, "127.0.0.2", f"127.0.0.{2 * rank + 1}", SECRET))
    address = host.get("stream/addr").decode().split("|")
    return sender, receivers, (address[0], int(address[1])), host


def _stranger(address) -> socket.socket:
    sock = socket.create_connection(address, source_address=("127.0.0.4", 0))
    sock.settimeout(30)
    return sock


def _hung_up(sock: socket.socket) -> bool:
    """Reads what is left (a challenge, perhaps) until the sender closes the connection."""
    while True:
        try:
            if sock.recv(1 << 16) == b"":
                return True
        except ConnectionResetError:
            return True


def _streams(sender, receivers, timeout: float = 30.0):
    with ThreadPoolExecutor(max_workers=len(receivers)) as pool:
        dialled = [pool.submit(r.connect, timeout) for r in receivers]
        sending = sender.connect(timeout)
        return sending, [d.result(60) for d in dialled]


def _moves(sending, receiving) -> None:
    data = torch.arange(1 << 16, dtype=torch.int32)
    into = [torch.zeros_like(data) for _ in receiving]
    works = [r.start([t.view(torch.uint8)])[0] for r, t in zip(receiving, into, strict=True)]
    sending.start([data.view(torch.uint8)])[0].wait(timedelta(seconds=30))
    for work, got in zip(works, into, strict=True):
        work.wait(timedelta(seconds=30))
        assert torch.equal(got, data)
    sending.close()
    for r in receiving:
        r.close()


def test_silent_callers_that_came_first_do_not_delay_the_members(monkeypatch):
    monkeypatch.setattr(stream_admission, "HELLO_TIMEOUT_S", 600.0)  # far past the 30 s join deadline
    sender, receivers, address, _ = _offers(world_size=3)
    silent = [_stranger(address) for _ in range(20)]  # in the backlog before any member
    half = _stranger(address)
    half.sendall(b"\x01\x00\x00")  # the start of a hello, never finished
    sending, receiving = _streams(sender, receivers)
    _moves(sending, receiving)
    for sock in [*silent, half]:
        assert _hung_up(sock)  # once the members were in: not one byte of weights
        sock.close()


def test_a_wrong_hello_is_dropped_and_the_member_still_joins(monkeypatch):
    monkeypatch.setattr(stream_admission, "HELLO_TIMEOUT_S", 600.0)
    sender, receivers, address, _ = _offers()
    wrong = _stranger(address)
    with ThreadPoolExecutor(max_workers=1) as pool:
        sending = pool.submit(sender.connect, 30.0)
        challenge = wrong.recv(stream_admission.CHALLENGE_BYTES)
        assert len(challenge) == stream_admission.CHALLENGE_BYTES
        wrong.sendall(stream_admission.HELLO.pack(1, b"\x00" * 32))  # rank 1 without the key
        assert _hung_up(wrong)
        receiving = receivers[0].connect(30.0)
        _moves(sending.result(60), [receiving])
    wrong.close()


def test_greetings_beyond_the_cap_are_hung_up_on_at_once(monkeypatch):
    monkeypatch.setattr(stream_admission, "MAX_GREETINGS", 2)
    monkeypatch.setattr(stream_admission, "HELLO_TIMEOUT_S", 1.0)
    sender, receivers, address, _ = _offers()
    with ThreadPoolExecutor(max_workers=1) as pool:
        sending = pool.submit(sender.connect, 60.0)
        held = [_stranger(address) for _ in range(2)]
        for sock in held:
            assert len(sock.recv(stream_admission.CHALLENGE_BYTES)) == stream_admission.CHALLENGE_BYTES  # greeted
        beyond = _stranger(address)
        assert beyond.recv(64) == b""  # hung up on without a challenge: both greetings are taken
        for sock in held:
            assert _hung_up(sock)  # silent past their own hello timeout
        receiving = receivers[0].connect(30.0)  # the greetings are free again
        _moves(sending.result(60), [receiving])
    for sock in [*held, beyond]:
        sock.close()


def test_the_join_deadline_still_ends_an_admission_nobody_completes(monkeypatch):
    monkeypatch.setattr(stream_admission, "HELLO_TIMEOUT_S", 600.0)
    sender, _receivers, address, _ = _offers()
    silent = _stranger(address)
    with pytest.raises(OSError, match=r"ranks \[1\] did not connect to the weight stream within 1.0s"):
        sender.connect(1.0)
    assert _hung_up(silent)
    silent.close()
