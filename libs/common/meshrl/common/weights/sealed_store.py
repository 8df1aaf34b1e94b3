"""The store a secured weight group's backend is built over: every value torch's gloo / NCCL backend writes
into the group's store (NCCL's unique id, gloo's addresses, the stream's offer) is encrypted and signed with
the service token, and every value it reads must carry the token's signature. The TCPStore has no
authentication: a stranger who reaches it could read NCCL's unique id and join its bootstrap as a rank (and
receive the model), or read gloo's addresses; sealed, it reads ciphertext, and what it writes is refused.

The cipher: HMAC-SHA256 in counter mode over a fresh 16-byte nonce (a keystream), then HMAC-SHA256 over the key,
nonce and ciphertext (encrypt-then-MAC), with keys derived from the token and the group's name. Counters
(`add`) stay in the clear: the store adds them itself. Built by `Rendezvous.backend_store` (rendezvous.py) when a secret is set.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from datetime import timedelta

import torch.distributed as dist

from meshrl.common.weight_group_secret import mac

NONCE_BYTES = 16
TAG_BYTES = 32


class StoreTampered(RuntimeError):
    """A value in the group's store was not sealed with this member's service token."""


class SealedStore(dist.Store):
    """`inner` with every value sealed under `secret` (see the module's docstring)."""

    def __init__(self, inner: dist.Store, secret: str, group: str) -> None:
        super().__init__()
        self.inner = inner
        self.group = group
        self._cipher = mac(secret, "meshrl-weight-store-cipher", group)
        self._signer = mac(secret, "meshrl-weight-store-mac", group)

    # --------------------------------------------------------------- sealing
    def _keystream(self, nonce: bytes, n: int) -> bytes:
        blocks = (
            hmac.new(self._cipher, nonce + i.to_bytes(8, "little"), hashlib.sha256).digest()
            for i in range((n + 31) // 32)
        )
        return b"".join(blocks)[:n]

    def seal(self, key: str, value: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        body = _xor(value, self._keystream(nonce, len(value)))
        return nonce + body + mac(self._signer, key, nonce, body)

    def open(self, key: str, sealed: bytes) -> bytes:
        nonce, body, tag = sealed[:NONCE_BYTES], sealed[NONCE_BYTES:-TAG_BYTES], sealed[-TAG_BYTES:]
        if len(sealed) < NONCE_BYTES + TAG_BYTES or not hmac.compare_digest(tag, mac(self._signer, key, nonce, body)):
            raise StoreTampered(
                f"weight group {self.group!r}: {key} in the group's store is not sealed with this member's "
                "service token (a member with another token, or someone who is not a member wrote it); give "
                "the trainer and every replica the same server.auth token"
            )
        return _xor(body, self._keystream(nonce, len(body)))

    # --------------------------------------------------------------- dist.Store
    def set(self, key: str, value) -> None:
        self.inner.set(key, self.seal(key, value if isinstance(value, bytes) else str(value).encode()))

    def get(self, key: str) -> bytes:
        return self.open(key, self.inner.get(key))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.open(k, v) for k, v in zip(keys, self.inner.multi_get(keys), strict=True)]

    def multi_set(self, keys: list[str], values: list) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def add(self, key: str, amount: int) -> int:
        return self.inner.add(key, amount)

    def compare_set(self, key: str, expected, desired) -> bytes:
        raise NotImplementedError("compare_set on a sealed weight-group store: its values are sealed")

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)


def _xor(data: bytes, stream: bytes) -> bytes:
    return (int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")).to_bytes(len(data), "little")
