"""Rank 0's admission to the weight stream: it accepts connections and greets them all at once, in one thread
(a challenge out; a rank and an HMAC of the key over the challenge in; rank 0's own HMAC back), so a caller that
is slow or says nothing holds only its own greeting, for at most `hello_timeout_s`, and never delays the other
members' admission. The whole admission has one deadline however many callers come; at most MAX_GREETINGS
greetings are in flight, and a connection beyond them is hung up on at once.

Used by `StreamOffer.connect` (stream.py); a receiver's side of the handshake is `StreamOffer._dial`.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field

from meshrl.common.weight_group_secret import mac

HELLO = struct.Struct("<q32s")  # rank, HMAC over the challenge
CHALLENGE_BYTES = 32
HELLO_TIMEOUT_S = 5.0  # a connection that does not say who it is in time is dropped
MAX_GREETINGS = 256  # greetings in flight at once (a flood of silent callers is hung up on beyond it)


@dataclass
class _Greeting:
    challenge: bytes
    until: float  # dropped at this time unless it proved the key
    heard: bytearray = field(default_factory=bytearray)


class Admission:
    """One proven connection per receiver rank (1 .. world_size - 1) on `listener`, within `timeout_s`."""

    def __init__(self, listener: socket.socket, key: bytes, nonce: str, world_size: int) -> None:
        self.listener = listener
        self.key = key
        self.nonce = nonce
        self.world_size = world_size
        self.hello_timeout_s = HELLO_TIMEOUT_S
        self.max_greetings = MAX_GREETINGS
        self.peers: dict[int, socket.socket] = {}
        self._greetings: dict[socket.socket, _Greeting] = {}
        self._selector = selectors.DefaultSelector()

    def run(self, timeout_s: float) -> dict[int, socket.socket]:
        """The members' sockets by rank (blocking, no timeout); TimeoutError when the deadline passed first
        (every socket accepted so far closed)."""
        deadline = time.monotonic() + timeout_s
        self.listener.setblocking(False)
        self._selector.register(self.listener, selectors.EVENT_READ)
        try:
            while len(self.peers) < self.world_size - 1:
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError("the join deadline passed")
                for sock in [s for s, g in self._greetings.items() if g.until <= now]:
                    self._drop(sock)  # silent or slow: only its own greeting waited for it
                wake = min([deadline, *(g.until for g in self._greetings.values())])
                for ready, _ in self._selector.select(max(0.0, wake - now)):
                    if ready.fileobj is self.listener:
                        self._accept_waiting()
                    else:
                        self._hear(ready.fileobj)
        except BaseException:
            for sock in self.peers.values():
                sock.close()
            self.peers = {}
            raise
        finally:
            for sock in list(self._greetings):
                self._drop(sock)
            self._selector.close()
        for sock in self.peers.values():
            sock.setblocking(True)
        return self.peers

    def _accept_waiting(self) -> None:
        """Accepts every waiting connection and sends each its challenge (32 bytes fit an empty send buffer)."""
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            if len(self._greetings) >= self.max_greetings:
                sock.close()
                continue
            sock.setblocking(False)
            challenge = os.urandom(CHALLENGE_BYTES)
            try:
                if sock.send(challenge) != CHALLENGE_BYTES:
                    raise OSError("the challenge did not fit the socket's buffer")
            except OSError:
                sock.close()
                continue
            self._greetings[sock] = _Greeting(challenge, time.monotonic() + self.hello_timeout_s)
            self._selector.register(sock, selectors.EVENT_READ)

    def _hear(self, sock: socket.socket) -> None:
        greeting = self._greetings.get(sock)
        if greeting is None:
            return
        try:
            got = sock.recv(HELLO.size - len(greeting.heard))
        except BlockingIOError:
            return
        except OSError:
            got = b""
        if not got:
            self._drop(sock)  # hung up before saying who it is
            return
        greeting.heard += got
        if len(greeting.heard) < HELLO.size:
            return
        rank, proof = HELLO.unpack(bytes(greeting.heard))
        expected = mac(self.key, "member", self.nonce, rank, greeting.challenge)
        if not 0 < rank < self.world_size or rank in self.peers or not hmac.compare_digest(proof, expected):
            self._drop(sock)  # not a member of this group (or a duplicate)
            return
        self._selector.unregister(sock)
        del self._greetings[sock]
        try:
            sock.setblocking(True)
            sock.settimeout(self.hello_timeout_s)
            sock.sendall(mac(self.key, "sender", self.nonce, rank, greeting.challenge))
            sock.settimeout(None)
        except OSError:
            sock.close()
            return
        self.peers[rank] = sock

    def _drop(self, sock: socket.socket) -> None:
        self._greetings.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        sock.close()
