"""sha256 of many tensors at once, spread over a few worker threads (hashlib releases the GIL).

Used by `safetensors_io.py` when writing (one job per tensor) and when verifying (byte ranges
fed as a file is read). Each tensor belongs to one worker, so its bytes are hashed in order
while different tensors are hashed on different cores.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

WORKERS = max(1, min(4, os.cpu_count() or 1))


class Span(Protocol):
    name: str
    begin: int
    end: int


class TensorHashers:
    """One sha256 per span (a tensor's byte range in a file's data section)."""

    def __init__(self, spans: Sequence[Span], workers: int = WORKERS) -> None:
        self._spans = sorted(spans, key=lambda s: s.begin)
        self._ends = [s.end for s in self._spans]
        self._hashers = {s.name: hashlib.sha256() for s in self._spans}
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
        """Waits for every queued job and returns name -> sha256 hex."""
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


def sha256_many(views: Sequence[memoryview], pool: ThreadPoolExecutor) -> list[Future[str]]:
    """Hashes each view on `pool` (one job per view)."""
    return [pool.submit(lambda v: hashlib.sha256(v).hexdigest(), v) for v in views]
