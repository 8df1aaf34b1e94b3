"""Reading a committed batch out of Redis: its manifest (waiting for it to appear), then the whole payload
chunk by chunk (read-ahead), or only the byte ranges of the asked columns and rows (GETRANGE, pipelined);
or, for the direct data path, only where those bytes lie (`locate`).
Used by `BatchStore.open` (meshrl.databuffer.batches); what to read is decided by meshrl.databuffer.selection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from meshrl.api.common.v1 import tensor_pb2
from meshrl.common.errors import DataLoss, InvalidArgument, NotFound
from meshrl.databuffer.config import BatchConfig, LimitsConfig
from meshrl.databuffer.keys import BatchRef, KeySpace
from meshrl.databuffer.notify import CommitNotifier
from meshrl.databuffer.selection import ReadCounter, chunk_pieces, select


@dataclass
class StoredBatch:
    """A committed batch being read: its header and its payload as chunks, in order."""

    ref: BatchRef
    header: tensor_pb2.BatchHeader
    total_bytes: int
    chunks: Iterator[bytes] | None  # None: over the caller's limit, nothing read


@dataclass
class Located:
    """Where a batch's selected payload lies: (key, first, last byte inclusive, whole value) in payload order."""

    header: tensor_pb2.BatchHeader
    ranges: list[tuple[str, int, int, bool]]
    manifest_key: str
    generation: str
    payload: bytes | None = None  # the selection itself, when it was small enough to come back inline


# KEYS: manifest. ARGV (optional): largest payload to return. The manifest's fields, and for a one-chunk batch
# (of at most ARGV[1] bytes) its chunk (same hash tag: same slot). A payload a zero-RPC put kept under the
# batch's value key (manifest field 'v' = '1') comes whatever its size, followed by 'e'.
_OPEN = """
local f = redis.call('HMGET', KEYS[1], 'gen', 'n', 'cb', 'bytes', 'h')
if not f[1] then return false end
if f[2] == '1' and redis.call('HGET', KEYS[1], 'v') == '1' then
  f[6] = redis.call('GET', string.sub(KEYS[1], 1, -2) .. 'v')
  f[7] = 'e'
elseif f[2] == '1' and (ARGV[1] == nil or tonumber(f[4]) <= tonumber(ARGV[1])) then
  f[6] = redis.call('GET', string.sub(KEYS[1], 1, -2) .. 'c:' .. f[1] .. ':0')
end
return f
"""


class BatchReader:
    def __init__(
        self,
        client: Any,
        keys: KeySpace,
        notifier: CommitNotifier,
        limits: LimitsConfig,
        cfg: BatchConfig,
        executor: ThreadPoolExecutor,
    ) -> None:
        self.client = client
        self.keys = keys
        self.notifier = notifier
        self.limits = limits
        self.cfg = cfg
        self._io = executor
        self.counter = ReadCounter()
        self._open = client.register_script(_OPEN)

    def _read_manifest(self, ref: BatchRef, up_to: int | None = None) -> list[Any] | None:
        """[gen, n, cb, bytes, header] of the manifest, plus the payload when it is one chunk (of at most `up_to`
        bytes when given): one round trip."""
        fields = self._open(keys=[self.keys.manifest(ref)], args=[] if up_to is None else [up_to])
        return fields or None

    def _wait_manifest(self, ref: BatchRef, wait_seconds: float, read) -> list[Any]:
        """`read(ref)` (the manifest's fields) once it is there, waiting up to `wait_seconds`, else NotFound."""
        if not 0 <= wait_seconds <= 86400:
            raise InvalidArgument(f"wait_seconds = {wait_seconds} must be in [0, 86400]", field="wait_seconds")
        if wait_seconds == 0:
            fields = read(ref)
        else:
            deadline = time.monotonic() + wait_seconds
            with self.notifier.watch(self.keys.batch_tag(ref)) as committed:
                while (fields := read(ref)) is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    committed.wait(min(remaining, self.cfg.poll_seconds))
                    committed.clear()
        if fields is None:
            waited = f" after waiting {wait_seconds:g}s" if wait_seconds else ""
            raise NotFound(f"batch {ref} is not in the data buffer{waited}; check that its producer ran (and its TTL)")
        return fields

    def open(
        self,
        ref: BatchRef,
        *,
        wait_seconds: float = 0.0,
        columns: Sequence[str] = (),
        rows: tuple[int, int] | None = None,
        missing_ok: bool = False,
        limit: int | None = None,
    ) -> StoredBatch:
        """The committed batch under `ref` (only `columns` of rows [begin, end) when given), waiting up to
        `wait_seconds` for it to appear. Bad columns or rows raise before anything is read."""
        fields = self._wait_manifest(ref, wait_seconds, self._read_manifest)
        gen, n, cb, total, blob = fields[:5]
        only = fields[5] if len(fields) > 5 else None  # the one chunk of a one-chunk batch
        stored = tensor_pb2.BatchHeader.FromString(blob)
        chosen = select(stored, columns, rows, missing_ok=missing_ok, what=f"batch {ref}")
        if limit is not None and chosen.header.total_bytes > limit:  # not read, not counted: the caller streams it
            return StoredBatch(ref, chosen.header, chosen.header.total_bytes, None)
        self.counter.count(chosen.header.total_bytes, chosen.rows)
        if only is not None:
            if len(only) != int(total):
                self._lost(ref, gen.decode(), 0)
            chunks = iter([only] if chosen.whole else [memoryview(only)[o : o + k] for o, k in chosen.spans])
        elif chosen.whole:
            chunks = self._read_chunks(ref, gen.decode(), int(n), int(cb), int(total))
        else:
            chunks = self._read_pieces(ref, gen.decode(), chunk_pieces(chosen.spans, int(cb)))
        return StoredBatch(ref, chosen.header, chosen.header.total_bytes, chunks)

    def locate(
        self,
        ref: BatchRef,
        *,
        wait_seconds: float = 0.0,
        columns: Sequence[str] = (),
        rows: tuple[int, int] | None = None,
        missing_ok: bool = False,
        inline_below: int = 0,
    ) -> Located:
        """Which Redis values (whole, or byte ranges) hold the batch or its selected columns and rows, for a
        client that reads them itself (the direct data path); one round trip once the batch is there. A
        one-chunk batch whose selection has fewer than `inline_below` bytes (or whose payload a zero-RPC put
        kept under its value key) comes back inline instead."""
        if inline_below < 0:
            raise InvalidArgument(f"inline_below = {inline_below} must be >= 0", field="inline_below")
        up_to = max(0, min(inline_below, self.limits.chunk_bytes))
        fields = self._wait_manifest(ref, wait_seconds, lambda r: self._read_manifest(r, up_to))
        gen_b, n_b, cb_b, total_b, blob = fields[:5]
        only = fields[5] if len(fields) > 5 else None
        gen, n, cb, total = gen_b.decode(), int(n_b), int(cb_b), int(total_b)
        chosen = select(
            tensor_pb2.BatchHeader.FromString(blob), columns, rows, missing_ok=missing_ok, what=f"batch {ref}"
        )
        self.counter.count(chosen.header.total_bytes, chosen.rows)
        manifest = self.keys.manifest(ref)
        embedded = len(fields) > 6  # no chunk to point at: the selection comes inline whatever its size
        if only is not None and (embedded or chosen.header.total_bytes < inline_below):
            if len(only) != total:
                self._lost(ref, gen, 0)
            payload = bytes(only) if chosen.whole else b"".join(memoryview(only)[o : o + k] for o, k in chosen.spans)
            return Located(chosen.header, [], manifest, gen, payload)
        if chosen.whole:
            sizes = [cb] * (n - 1) + [total - cb * (n - 1)] if n else []
            ranges = [(self.keys.chunk(ref, gen, i), 0, size - 1, True) for i, size in enumerate(sizes)]
        else:
            pieces = chunk_pieces(chosen.spans, cb)
            ranges = [(self.keys.chunk(ref, gen, i), first, last, False) for i, first, last in pieces]
        return Located(chosen.header, ranges, manifest, gen)

    def _read_pieces(self, ref: BatchRef, gen: str, pieces: list[tuple[int, int, int]]) -> Iterator[bytes]:
        """Byte ranges of chunks (GETRANGE), pipelined in groups of about one chunk's size."""
        group: list[tuple[int, int, int]] = []
        size = 0
        for i, piece in enumerate(pieces):
            group.append(piece)
            size += piece[2] - piece[1] + 1
            if size < self.limits.chunk_bytes and i + 1 < len(pieces):
                continue
            pipe = self.client.pipeline(transaction=False)
            for index, first, last in group:
                pipe.getrange(self.keys.chunk(ref, gen, index), first, last)
            for (index, first, last), data in zip(group, pipe.execute()):
                if len(data) != last - first + 1:
                    self._lost(ref, gen, index)
                yield data
            group, size = [], 0

    def _lost(self, ref: BatchRef, gen: str, index: int) -> None:
        current = self.client.hget(self.keys.manifest(ref), "gen")
        if current is None or current.decode() != gen:
            raise NotFound(f"batch {ref} was deleted while it was being read")
        raise DataLoss(
            f"batch {ref}: chunk {index} is missing from Redis or short; was it evicted? Set Redis' "
            "maxmemory-policy to noeviction"
        )

    def _read_chunks(self, ref: BatchRef, gen: str, n: int, cb: int, total: int) -> Iterator[bytes]:
        """The chunks in order; the next one is fetched while the caller sends the current one."""
        ahead: Future | None = None
        for i in range(n):
            data = ahead.result() if ahead is not None else self.client.get(self.keys.chunk(ref, gen, i))
            ahead = self._io.submit(self.client.get, self.keys.chunk(ref, gen, i + 1)) if i + 1 < n else None
            expected = cb if i < n - 1 else total - cb * (n - 1)
            if data is None:
                self._lost(ref, gen, i)
            if len(data) != expected:
                raise DataLoss(f"batch {ref}: chunk {i} holds {len(data)} bytes, expected {expected}")
            yield data
