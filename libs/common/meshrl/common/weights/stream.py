"""The CPU weight group's byte stream: one TCP connection from rank 0 to each receiver, tensors written
and read straight from (into) their own memory, in order.

Why: on gloo every broadcast is one operation with a fixed cost (about 0.1-0.5 ms each on a loaded
2-core host), so a model sent tensor by tensor pays it a few hundred times, and packing the tensors into
one buffer instead pays two copies of the model. A stream has no per-operation cost: a receiver reads
each tensor's bytes into its target as they come, and only the order of the bytes matters, so the
sender's and the receivers' calls need not pair up one to one as collective operations must.

Set-up (inside the group's Backend, over the group's store, see transport.py): before the gloo group is
made, every member that can stream posts `stream/<rank>`; rank 0 posts its listening address and a
token (`stream/addr`). Once the gloo group exists every member has posted or never will, so all decide
alike: the stream is used only when every member offered it (a member started with
`WeightGroupOptions.cpu_wire="gloo"`, or one of an older release, keeps the whole group on gloo).
Receivers then connect to rank 0, which sends each a fresh challenge; a receiver answers with its rank and
an HMAC over the challenge, and rank 0 answers with its own, so each side knows the other holds the key
before a byte of weights moves; rank 0 accepts one connection per receiver within the join deadline (one
deadline for them all, however many strangers call), greeting every caller at once (stream_admission.py: a
silent or slow caller never delays the others). The key is the service token (`secret`) when the
process has one: then a stranger who reads the group's store can neither take a receiver's place nor pose
as the sender, the stream is required (no gloo fallback) and binds only its address. Without a token the
key is the nonce in the store, which keeps strangers out only where the store is private.

`start(tensors)` queues the tensors for each connection's thread and returns a work per call; a work's
`wait(timeout)` raises on a broken connection or a timeout, as gloo's works do. `abort` shuts the
connections down, so a thread blocked in a send or receive fails at once.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import queue
import socket
import threading
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from meshrl.common.weight_group_secret import mac
from meshrl.common.weights.stream_admission import CHALLENGE_BYTES, HELLO, Admission

SOCKET_BUFFER_BYTES = 8 << 20  # loopback and LAN: large buffers keep both threads busy


class StreamRefused(OSError):
    """A secured group cannot stream (a member offered none), or a peer did not prove the key."""


class StreamWork:
    """One `start` call's tensors on every connection; done when each connection has moved them."""

    def __init__(self, peers: int) -> None:
        self._left = peers
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.error: str | None = None
        if peers == 0:
            self._done.set()

    def settle(self, error: str | None = None) -> None:
        with self._lock:
            if error is not None and self.error is None:
                self.error = error
            self._left -= 1
            if self._left <= 0 or error is not None:
                self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: timedelta | None = None) -> bool:
        if not self._done.wait(None if timeout is None else timeout.total_seconds()):
            raise RuntimeError("the weight stream timed out")
        if self.error is not None:
            raise RuntimeError(self.error)
        return True


class _Connection:
    """One socket and the thread that moves queued tensors over it (sends on rank 0, receives elsewhere)."""

    def __init__(self, sock: socket.socket, peer: int, sending: bool) -> None:
        self.sock = sock
        self.peer = peer
        self.sending = sending
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.broken: str | None = None
        self.thread = threading.Thread(target=self._run, name=f"weights-stream-{peer}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        move = self._send if self.sending else self._receive
        while True:
            job = self.jobs.get()
            if job is None:
                return
            tensors, work = job
            if self.broken is None:
                try:
                    for tensor in tensors:
                        move(tensor)
                except OSError as e:
                    self.broken = f"the weight stream to rank {self.peer} broke ({e})"
            work.settle(self.broken)

    def _send(self, tensor: torch.Tensor) -> None:
        if tensor.numel():
            self.sock.sendall(memoryview(tensor.detach().numpy()))

    def _receive(self, tensor: torch.Tensor) -> None:
        view = memoryview(tensor.detach().numpy())
        done, total = 0, len(view)
        while done < total:
            got = self.sock.recv_into(view[done:], total - done)
            if got == 0:
                raise ConnectionResetError(f"rank {self.peer} closed the stream after {done} of {total} bytes")
            done += got

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the peer already hung up: nothing left to shut down
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.jobs.put(None)


class WeightStream:
    """Rank 0's connections to every receiver, or a receiver's connection to rank 0."""

    def __init__(self, connections: list[_Connection]) -> None:
        self._connections = connections

    def start(self, tensors: Sequence[torch.Tensor]) -> list[StreamWork]:
        """Queues uint8 CPU tensors (contiguous) to go out (rank 0) or to be filled (receivers) in order; one
        work for them all (a work per tensor measured 1.4-1.6x one raw broadcast at 10M parameters, one work
        1.1-1.3x: each settle and wait costs more than a receiver gains by using tensors as they land)."""
        work = StreamWork(len(self._connections))
        for c in self._connections:
            c.jobs.put((list(tensors), work))
        return [work]

    def close(self) -> None:
        for c in self._connections:
            c.close()
        self._connections = []


class StreamOffer:
    """A member's half of the set-up: post the offer before the gloo group is made, `connect` after it."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        master_address: str,
        local_address: str | None,
        secret: str | None = None,
    ) -> None:
        """local_address: the address this member was told to use (None: rank 0 listens on the master
        address, a receiver dials from wherever its route leads). secret: the service token members prove."""
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.local_address = local_address
        self.secret = secret
        self._listener: socket.socket | None = None
        if rank == 0:
            self._listener, host = _listen(local_address or master_address, master_address, strict=bool(secret))
            port = self._listener.getsockname()[1]
            store.set("stream/addr", f"{host}|{port}|{os.urandom(16).hex()}")
        store.set(f"stream/{rank}", "1")

    def connect(self, timeout_s: float) -> WeightStream | None:
        """The stream when every member offered one (checked without waiting: the gloo group exists, so
        every member posted already or never will), else None (the group stays on gloo)."""
        try:
            # one key per check: torch's TCPStore.check of several keys answered False for keys that all
            # existed in 15 of 300 fresh stores here (torch 2.13), which split a group's decision
            if not all(self.store.check([f"stream/{r}"]) for r in range(self.world_size)):
                if self.secret:
                    raise StreamRefused(
                        "the weight group is secured (a service token is set) but a member offered no stream "
                        "(cpu_wire 'gloo' or an older meshrl): give every member the same token and cpu_wire 'stream'"
                    )
                return None
            host, port, nonce = self.store.get("stream/addr").decode().split("|")
            key = (self.secret or nonce).encode()
            if self.rank == 0:
                return WeightStream(self._accept(key, nonce, timeout_s))
            return WeightStream([self._dial(host, int(port), key, nonce, timeout_s)])
        finally:
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    def _accept(self, key: bytes, nonce: str, timeout_s: float) -> list[_Connection]:
        """One proven connection per receiver, all within `timeout_s` (strangers are hung up on)."""
        assert self._listener is not None
        admission = Admission(self._listener, key, nonce, self.world_size)
        try:
            peers = admission.run(timeout_s)
        except OSError as e:
            missing = sorted(set(range(1, self.world_size)) - set(admission.peers))
            raise OSError(f"ranks {missing} did not connect to the weight stream within {timeout_s:.1f}s ({e})") from e
        return [_Connection(_tune(peers[r]), r, sending=True) for r in sorted(peers)]

    def _dial(self, host: str, port: int, key: bytes, nonce: str, timeout_s: float) -> _Connection:
        source = (self.local_address, 0) if self.local_address else None
        sock = socket.create_connection((host, port), timeout=timeout_s, source_address=source)
        try:
            challenge = _read_exactly(sock, CHALLENGE_BYTES)
            sock.sendall(HELLO.pack(self.rank, mac(key, "member", nonce, self.rank, challenge)))
            proof = _read_exactly(sock, 32)
        except OSError as e:
            sock.close()
            raise StreamRefused(
                f"the weight stream at {host}:{port} refused rank {self.rank} ({e}): the sender "
                "and this member must hold the same service token (server.auth)"
            ) from e
        if not hmac.compare_digest(proof, mac(key, "sender", nonce, self.rank, challenge)):
            sock.close()
            raise StreamRefused(
                f"the weight stream at {host}:{port} did not prove the service token: not the "
                "trainer of this group (or another token); no weights were read from it"
            )
        sock.settimeout(None)
        return _Connection(_tune(sock), 0, sending=False)


def _listen(host: str, master_address: str, strict: bool = False) -> tuple[socket.socket, str]:
    """A listening socket on `host`, and the address receivers dial: `host` itself, or the master
    address when `host` is not one of this machine's own (NAT, a name) and every interface listens
    (never when `strict`: a secured group binds only the address it was given)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except OSError as e:
        sock.close()
        if strict:
            raise StreamRefused(
                f"cannot bind the weight stream to {host} ({e}); a secured weight group listens "
                "only there: set weights.group_address to an address of the trainer's host"
            ) from e
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.bind(("", 0))
        host = master_address
    sock.listen(64)
    return sock, host


def _tune(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):  # a capped buffer size only slows the stream down
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
    return sock


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("a peer closed the weight stream during its greeting")
        data += chunk
    return data
