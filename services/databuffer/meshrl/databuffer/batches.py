"""Keyed batches in Redis: put / get (optionally waiting) / delete / list under (job, step, node[, shard]).

A batch is a manifest hash (generation, chunk count and size, the serialized BatchHeader)
plus its payload cut into chunks below Redis' 512 MB value limit, all under one hash tag.
A put stages its chunks under a fresh generation with a short TTL, then one Lua script
checks them and swaps the manifest: the batch appears whole or not at all, and a failed or
cancelled put deletes what it staged; the last chunk's write, the index update and the commit go in one
pipeline (a one-chunk put is three round trips: reserve, that pipeline, settle). Reads are
meshrl.databuffer.reads'. Used by `DataBuffer` (meshrl.databuffer.store).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from meshrl.api.common.v1 import tensor_pb2
from meshrl.common.errors import Aborted, AlreadyExists, InvalidArgument
from meshrl.common.put_checks import check_put_header, row_count
from meshrl.databuffer.batch_scripts import COMMIT, DELETE
from meshrl.databuffer.indexes import Indexes
from meshrl.databuffer.keys import BatchRef, check_name
from meshrl.databuffer.ledger import Ledger, now_ms
from meshrl.databuffer.orphans import PendingCleanups
from meshrl.databuffer.reads import BatchReader, StoredBatch

log = logging.getLogger(__name__)
TTL_MARGIN_MS = 60_000  # chunks outlive their manifest, so a live manifest never points at expired chunks
IN_FLIGHT = 2  # chunk writes / reads overlapped with the network on the other side


@dataclass(frozen=True)
class PutResult:
    bytes_written: int
    chunks: int


def _flat(frame: Any) -> memoryview:
    view = memoryview(frame)
    return view if view.ndim == 1 and view.itemsize == 1 else view.cast("B")


def _staged_error(ref: BatchRef, gen: str, status: str, key: str, detail: str) -> str:
    """Why the chunks a client staged for a direct put cannot be committed (nothing was changed)."""
    if status == "samegen":
        return f"batch {ref}: generation {gen} is the one already committed; stage under a fresh random generation"
    if status == "missing":
        return (
            f"batch {ref}: chunk {key} was not staged (or its staging TTL ran out); SET every chunk of generation "
            f"{gen} before CommitDirectPut"
        )
    got, want = detail.split()
    return f"batch {ref}: staged chunk {key} holds {got} bytes, expected {want}; cut the payload at chunk_bytes"


class BatchStore:
    def __init__(self, reader: BatchReader, indexes: Indexes, ledger: Ledger) -> None:
        """Puts and deletes batches on the Redis, keys, limits and I/O threads of `reader`, which serves reads."""
        self.reader = reader
        self.reads = reader.counter  # what GetBatch sent since this process started
        self.client = client = reader.client
        self.keys = reader.keys
        self.orphans = PendingCleanups()  # staged chunks of puts that failed while Redis was down
        self.indexes = indexes
        self.ledger = ledger
        self.notifier = reader.notifier
        self.limits = reader.limits
        self.cfg = reader.cfg
        self._io = reader._io
        self._commit = client.register_script(COMMIT)
        self._delete = client.register_script(DELETE)

    # --- put ---------------------------------------------------------------------------
    def check_put(self, ref: BatchRef, header: tensor_pb2.BatchHeader, ttl_seconds: int) -> tuple[bytes, int]:
        """Validates what a put announces; returns the serialized header and the TTL in seconds."""
        limits = self.limits
        return check_put_header(
            header,
            ttl_seconds,
            max_header_bytes=limits.max_header_bytes,
            max_batch_bytes=limits.max_batch_bytes,
            max_ttl_seconds=limits.max_ttl_seconds,
            default_ttl_seconds=self.cfg.default_ttl_seconds,
        )

    def put(
        self,
        ref: BatchRef,
        header: tensor_pb2.BatchHeader,
        frames: Iterable[Any],
        *,
        ttl_seconds: int = 0,
        overwrite: bool = True,
    ) -> PutResult:
        """Stores the batch whose payload arrives as `frames` (bytes-like, in order); atomic."""
        blob, ttl = self.check_put(ref, header, ttl_seconds)
        if len(self.orphans):
            self.orphans.retry(self._discard_now)
        manifest = self.keys.manifest(ref)
        if not overwrite and self.client.exists(manifest):
            raise AlreadyExists(f"batch {ref} already exists; put with overwrite=True or delete it first")
        gen = secrets.token_hex(8)
        member = self.keys.batch_member(ref, gen)
        total = header.total_bytes
        staging_ms = self.cfg.staging_ttl_seconds * 1000
        self.ledger.reserve({member: total + len(blob)}, now_ms() + staging_ms, f"batch {ref}")
        committed = False
        try:
            count, last = self._stage(ref, gen, frames, total, staging_ms)
            self._commit_manifest(
                ref, gen, count, total, blob, ttl, overwrite, last, staging_ms, rows=row_count(header)
            )
            committed = True
        finally:
            if not committed:
                self._discard(ref, gen, math.ceil(total / self.limits.chunk_bytes), member)
        return PutResult(total, count)

    def _stage(
        self, ref: BatchRef, gen: str, frames: Iterable[Any], total: int, staging_ms: int
    ) -> tuple[int, bytearray | memoryview | None]:
        """Writes the payload as chunks of `limits.chunk_bytes` (short TTL); returns the chunk count and the
        last chunk when it is not written yet (the commit's pipeline writes it: one round trip for a small put)."""
        cb = self.limits.chunk_bytes
        pending: deque[Future] = deque()
        count = 0

        def flush(data: Any) -> None:
            nonlocal count
            key = self.keys.chunk(ref, gen, count)
            count += 1
            pending.append(self._io.submit(self.client.set, key, data, px=staging_ms))
            while len(pending) >= IN_FLIGHT:
                pending.popleft().result()

        tail: memoryview | None = None
        try:
            buf = bytearray()
            received = 0
            for frame in frames:
                view = _flat(frame)
                n = view.nbytes
                received = self._check_frame(n, received, total)
                if n and not buf and received == total and n < cb:  # the whole rest in this frame: uncopied
                    tail = view
                    continue
                pos = 0
                while pos < n:
                    if not buf and n - pos >= cb:  # a whole chunk inside this frame: no copy
                        flush(view[pos : pos + cb])
                        pos += cb
                        continue
                    take = min(cb - len(buf), n - pos)
                    buf += view[pos : pos + take]
                    pos += take
                    if len(buf) == cb:
                        flush(buf)
                        buf = bytearray()
            if received != total:
                raise InvalidArgument(
                    f"payload: the stream ended after {received} of the {total} bytes announced in "
                    "start.header.total_bytes; send every tensor's bytes",
                    field="payload",
                )
            while pending:
                pending.popleft().result()
        finally:
            for future in pending:  # a failed put waits for its writes before deleting them
                future.exception()
        if tail is not None:
            return count + 1, tail
        return (count + 1, buf) if buf else (count, None)

    def _check_frame(self, n: int, received: int, total: int) -> int:
        """Bytes received with this frame of `n` bytes; refuses an oversized frame or one past the announced total."""
        if n > self.limits.max_frame_bytes:
            raise InvalidArgument(
                f"payload: a frame of {n} bytes exceeds limits.max_frame_bytes = "
                f"{self.limits.max_frame_bytes}; send the payload in smaller frames",
                field="payload",
            )
        if received + n > total:
            raise InvalidArgument(
                f"payload: more bytes than start.header.total_bytes = {total} arrived; the header's tensor "
                "nbytes must add up to the payload",
                field="payload",
            )
        return received + n

    def _commit_manifest(
        self,
        ref: BatchRef,
        gen: str,
        count: int,
        total: int,
        blob: bytes,
        ttl: int,
        overwrite: bool,
        last: bytearray | memoryview | None,
        staging_ms: int,
        direct: bool = False,
        rows: int = 0,
    ) -> None:
        """Swaps the manifest to the staged generation. The first try assumes a new key and goes in one
        pipeline with the last chunk's write and the index update: one round trip. `direct`: a client staged
        the chunks itself (meshrl.databuffer.direct), so their sizes are checked too, and the reservation
        already runs to the batch's expiry (the ledger is settled only when a generation was replaced)."""
        manifest = self.keys.manifest(ref)
        ttl_ms = ttl * 1000
        grace_ms = int(self.cfg.overwrite_grace_seconds * 1000)
        last_key = self.keys.chunk(ref, gen, count - 1)
        first_try = True
        new_keys = self.keys.chunks(ref, gen, count)
        old_gen, old_n = "", 0
        for _attempt in range(16):
            old_keys = self.keys.chunks(ref, old_gen, old_n) if old_gen else []
            args = [int(overwrite), old_gen, gen, count, self.limits.chunk_bytes, total, blob, now_ms(), ttl_ms]
            args += [
                ttl_ms + TTL_MARGIN_MS,
                grace_ms,
                count,
                old_n,
                self.keys.commit_channel(),
                self.keys.batch_tag(ref),
                int(direct),
                rows,
            ]
            keys = [manifest, *new_keys, *old_keys]
            reply = self._first_commit(ref, keys, args, last_key, last, staging_ms) if first_try else None
            if reply is None:
                reply = self._commit(keys=keys, args=args)
            first_try = False
            status, current, current_n = (x.decode() for x in reply)
            if status == "ok":
                if direct and not current:  # nothing was replaced, and the reservation runs to the expiry
                    return
                old = self.keys.batch_member(ref, old_gen) if old_gen else None
                self.ledger.settle(self.keys.batch_member(ref, gen), now_ms() + ttl_ms + TTL_MARGIN_MS, old, grace_ms)
                return
            if status == "exists":
                raise AlreadyExists(f"batch {ref} already exists; put with overwrite=True or delete it first")
            if direct and status in ("missing", "size", "samegen"):
                raise InvalidArgument(_staged_error(ref, gen, status, current, current_n), field="generation")
            if status == "missing":
                raise Aborted(
                    f"batch {ref}: staged chunk {current} expired before the put completed "
                    f"(batches.staging_ttl_seconds = {self.cfg.staging_ttl_seconds}); retry the put"
                )
            old_gen, old_n = current, int(current_n)  # 'changed': commit over the generation now there
        raise Aborted(f"batch {ref} kept changing under concurrent puts; retry the put")

    def _first_commit(
        self, ref: BatchRef, keys: list[str], args: list[Any], last_key: str, last: bytearray | None, staging_ms: int
    ) -> list[bytes] | None:
        """In one round trip and in order: the last chunk's write, the index update (before the commit: a
        committed batch is listed) and the commit. None when Redis lost the scripts (restarted): then the
        same steps run one by one, loading them."""
        ttl_ms = int(args[9])
        if not isinstance(self.client, RedisCluster):  # a cluster pipeline does not keep order across slots
            pipe = self.client.pipeline(transaction=False)
            if last is not None:
                pipe.set(last_key, last, px=staging_ms)
            self.indexes.queue_add_batch(pipe, ref, ttl_ms)
            pipe.evalsha(self._commit.sha, len(keys), *keys, *args)
            try:
                return pipe.execute()[-1]
            except NoScriptError:
                pass
        if last is not None:
            self.client.set(last_key, last, px=staging_ms)
        self.indexes.add_batch(ref, ttl_ms)
        return None

    def _discard(self, ref: BatchRef, gen: str, count: int, member: str) -> None:
        """Removes what a failed put staged; when Redis cannot be reached, retried at the next put."""
        try:
            self._discard_now(ref, gen, count, member)
        except Exception as exc:  # noqa: BLE001 - the original error matters more
            log.warning("could not clean up the failed put of %s (retried at the next put): %s", ref, exc)
            self.orphans.add((ref, gen, count, member))

    def _discard_now(self, ref: BatchRef, gen: str, count: int, member: str) -> None:
        """Deletes a put's staged chunks and releases its reservation, unless its commit went through."""
        current = self.client.hget(self.keys.manifest(ref), "gen")
        if current is not None and current.decode() == gen:
            return
        keys = self.keys.chunks(ref, gen, count)
        for i in range(0, len(keys), 512):
            self.client.delete(*keys[i : i + 512])
        self.ledger.release([member])

    # --- get ---------------------------------------------------------------------------
    def open(self, ref: BatchRef, **kwargs: Any) -> StoredBatch:
        """The committed batch under `ref` (meshrl.databuffer.reads: columns, rows, waiting)."""
        return self.reader.open(ref, **kwargs)

    # --- delete / list -------------------------------------------------------------------
    def delete(self, ref: BatchRef) -> bool:
        """Deletes the batch (and an overwritten generation still in its grace period)."""
        manifest = self.keys.manifest(ref)
        for _attempt in range(16):
            gen, n, prev_gen, prev_n = self.client.hmget(manifest, "gen", "n", "pg", "pn")
            if gen is None:
                self.indexes.remove_batch(ref)
                return False
            gens = [(gen.decode(), int(n))] + ([(prev_gen.decode(), int(prev_n))] if prev_gen else [])
            chunks = [key for g, count in gens for key in self.keys.chunks(ref, g, count)]
            status = self._delete(keys=[manifest, *chunks], args=[gens[0][0]])
            if status >= 0:
                self.ledger.release([self.keys.batch_member(ref, g) for g, _ in gens])
                self.indexes.remove_batch(ref)
                return status == 1
        raise Aborted(f"batch {ref} kept changing under concurrent puts; retry the delete")

    def delete_many(self, refs: list[BatchRef]) -> int:
        """Deletes these batches (a step's) in a few pipelined round trips, not four per batch; returns how
        many existed. A batch that changed under a concurrent put meanwhile is deleted by `delete`."""
        if not refs:
            return 0
        if isinstance(self.client, RedisCluster):  # scripts do not ride a cluster pipeline
            return sum(self.delete(ref) for ref in refs)
        pipe = self.client.pipeline(transaction=False)
        for ref in refs:
            pipe.hmget(self.keys.manifest(ref), "gen", "n", "pg", "pn")
        present = []
        for ref, (gen, n, prev_gen, prev_n) in zip(refs, pipe.execute()):
            if gen is not None:
                gens = [(gen.decode(), int(n))] + ([(prev_gen.decode(), int(prev_n))] if prev_gen else [])
                present.append((ref, gens))
        pipe = self.client.pipeline(transaction=False)
        for ref, gens in present:
            chunks = [key for g, count in gens for key in self.keys.chunks(ref, g, count)]
            self._delete(keys=[self.keys.manifest(ref), *chunks], args=[gens[0][0]], client=pipe)
        deleted, members = 0, []
        for (ref, gens), status in zip(present, pipe.execute() if present else []):
            if status < 0:
                deleted += self.delete(ref)
                continue
            deleted += status == 1
            members += [self.keys.batch_member(ref, g) for g, _ in gens]
        self.ledger.release(members)
        self.indexes.remove_batches(refs)
        return deleted

    def list(self, job_id: str, step: int = -1) -> list[BatchRef]:
        check_name(job_id, "job_id")
        if step < -1:
            raise InvalidArgument(f"step = {step} must be >= 0, or -1 for every step", field="step")
        refs = self.indexes.batches(job_id, step)
        if not refs:
            return []
        pipe = self.client.pipeline(transaction=False)
        for ref in refs:
            pipe.exists(self.keys.manifest(ref))
        return sorted(ref for ref, present in zip(refs, pipe.execute()) if present)

    def usage(self, job_id: str) -> tuple[int, int]:
        """(batches, bytes) of one job."""
        refs = self.list(job_id)
        if not refs:
            return 0, 0
        pipe = self.client.pipeline(transaction=False)
        for ref in refs:
            pipe.hget(self.keys.manifest(ref), "bytes")
        sizes = [int(s) for s in pipe.execute() if s is not None]
        return len(sizes), sum(sizes)

    def delete_job(self, job_id: str) -> int:
        """Deletes every batch of the job; returns how many existed."""
        check_name(job_id, "job_id")
        return sum(self.delete(ref) for ref in self.indexes.batches(job_id))
