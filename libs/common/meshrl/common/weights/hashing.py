"""Per-tensor integrity digests (sha256 or xxh3-128), spread over a few worker threads.

Used by `safetensors_io.py` when writing (one job per tensor) and when verifying (byte ranges
of a mapped file), and by `manifest.py` to check the algorithm a manifest names. Each tensor
belongs to one worker, so its bytes are hashed in order while different tensors are hashed on
different cores. sha256 is what every manifest carried before the choice existed (and what a
manifest without a "digest" field means); xxh3-128 is ~4x faster here and catches torn or
corrupted files as well, but it is not cryptographic: a file altered on purpose could be made
to match it (publish with sha256 where that is the threat; the manifest itself is always checked
against the sha256 the trainer announced).
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import xxhash

from meshrl.common.errors import InvalidArgument

WORKERS = max(1, min(4, os.cpu_count() or 1))
SHA256, XXH3_128 = "sha256", "xxh3_128"
DIGESTS: dict[str, Callable[[], Any]] = {SHA256: hashlib.sha256, XXH3_128: xxhash.xxh3_128}
HEX_LENGTH = {SHA256: 64, XXH3_128: 32}
DEFAULT_DIGEST = XXH3_128


def check_digest(algorithm: object, where: str) -> str:
    """`algorithm` if this library can compute it; else InvalidArgument naming the known ones."""
    if algorithm not in DIGESTS:
        raise InvalidArgument(
            f"{where}: digest algorithm {algorithm!r} is unknown; this meshrl computes {sorted(DIGESTS)} "
            "(upgrade meshrl on this side, or publish with one of those)"
        )
    return str(algorithm)


def is_hex_digest(value: object, algorithm: str) -> bool:
    return (
        isinstance(value, str) and len(value) == HEX_LENGTH[algorithm] and all(c in "0123456789abcdef" for c in value)
    )


class Span(Protocol):
    name: str
    begin: int
    end: int


class TensorHashers:
    """One digest per span (a tensor's byte range in a file's data section)."""

    def __init__(self, spans: Sequence[Span], algorithm: str = SHA256, workers: int = WORKERS) -> None:
        new = DIGESTS[check_digest(algorithm, "TensorHashers")]
        self._spans = sorted(spans, key=lambda s: s.begin)
        self._ends = [s.end for s in self._spans]
        self._hashers = {s.name: new() for s in self._spans}
        self._pools = [ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-hash") for _ in range(workers)]
        self._owner = _balanced_owners(self._spans, workers)

    def feed(self, view: memoryview, lo: int, hi: int, base: int = 0) -> list[Future[None]]:
        """Queues bytes [lo, hi) of the data section, held in `view` from offset `base`.
        The view must stay unchanged until the returned jobs are done."""
        jobs = []
        for s in self._spans[bisect.bisect_right(self._ends, lo) :]:
            if s.begin >= hi:
                break
            part = view[max(s.begin, lo) - base : min(s.end, hi) - base]
            jobs.append(self._pools[self._owner[s.name]].submit(self._hashers[s.name].update, part))
        return jobs

    def digests(self) -> dict[str, str]:
        """Waits for every queued job and returns name -> hex digest."""
        self.close()
        return {name: h.hexdigest() for name, h in self._hashers.items()}

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=True)

    def __enter__(self) -> TensorHashers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _balanced_owners(spans: Sequence[Span], workers: int) -> dict[str, int]:
    """Each tensor's worker, largest first onto the least loaded one, so no core hashes the two
    embedding-sized tensors while the others idle."""
    load = [0] * workers
    owners = {}
    for s in sorted(spans, key=lambda s: s.begin - s.end):
        w = load.index(min(load))
        owners[s.name] = w
        load[w] += s.end - s.begin
    return owners


def digest_many(views: Sequence[memoryview], pool: ThreadPoolExecutor, algorithm: str = SHA256) -> list[Future[str]]:
    """Hashes each view on `pool` (one job per view) with `algorithm`."""
    new = DIGESTS[check_digest(algorithm, "digest_many")]
    return [pool.submit(lambda v: new(v).hexdigest(), v) for v in views]
