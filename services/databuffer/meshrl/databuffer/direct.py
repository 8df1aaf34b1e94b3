"""The direct data path's control side: the client moves a batch's payload bytes to and from Redis itself,
and the service only says where (DescribeDirectPath, LocateBatch) and checks and commits what a client
staged (CommitDirectPut), so the payload crosses the network once instead of twice (client -> service -> Redis).
A one-value put and a whole-batch get need no RPC at all: the client runs this service's own scripts
(meshrl.databuffer.zero_rpc_scripts), whose SHA1s and keys `layout` describes.

A direct put stages its chunks under a generation the client chose (16 hex digits, random), with the
staging TTL; the commit reserves the budget, checks every chunk's size in the commit script and swaps the
manifest, exactly as a relayed put does after its own writes. A refused commit (bad header, over budget, a
chunk missing or of the wrong size) deletes the staged chunks and changes nothing else. Used by
`DataBuffer` (meshrl.databuffer.store); the client half is meshrl.common.direct_path.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from redis.cluster import RedisCluster

from meshrl.api.common.v1 import tensor_pb2
from meshrl.common.errors import AlreadyExists, InvalidArgument
from meshrl.common.put_checks import row_count
from meshrl.databuffer import zero_rpc_scripts
from meshrl.databuffer.batches import TTL_MARGIN_MS, BatchStore, PutResult
from meshrl.databuffer.keys import BatchRef
from meshrl.databuffer.ledger import now_ms
from meshrl.databuffer.reads import Located

GENERATION_RE = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True)
class ZeroRpcLayout:
    """What a client needs to put and get a batch with no RPC (the fields of ZeroRpcPath in the proto)."""

    put_sha: str
    count_read_sha: str
    manifest_key_template: str
    staging_key_template: str
    job_batches_key_template: str
    jobs_key: str
    ledger_keys: list[str]
    commit_channel: str
    read_stats_key: str
    batch_tag_template: str
    embed_max_bytes: int
    max_header_bytes: int
    max_ttl_seconds: int
    default_ttl_seconds: int
    overwrite_grace_ms: int
    ttl_margin_ms: int
    budget_max_bytes: int
    budget_max_entries: int
    value_key_template: str


@dataclass(frozen=True)
class DirectLayout:
    """What a client needs to stage chunks: the key template, chunk size and staging TTL; and the zero-RPC
    path's scripts and keys (None on a Redis Cluster, where their keys do not share a slot)."""

    chunk_key_template: str
    chunk_bytes: int
    staging_ttl_ms: int
    max_batch_bytes: int
    zero_rpc: ZeroRpcLayout | None = None


class DirectPath:
    def __init__(self, store: BatchStore) -> None:
        self.store = store

    def layout(self) -> DirectLayout:
        """The layout; loads the zero-RPC scripts into Redis (a client that got NOSCRIPT asks again)."""
        limits, cfg = self.store.limits, self.store.cfg
        return DirectLayout(
            self.store.keys.chunk_template(),
            limits.chunk_bytes,
            cfg.staging_ttl_seconds * 1000,
            limits.max_batch_bytes,
            None if isinstance(self.store.client, RedisCluster) else self._zero_rpc(),
        )

    def _zero_rpc(self) -> ZeroRpcLayout:
        store, keys = self.store, self.store.keys
        client, limits, ledger, templates = store.client, store.limits, store.ledger, keys.templates()
        return ZeroRpcLayout(
            put_sha=client.script_load(zero_rpc_scripts.PUT),
            count_read_sha=client.script_load(zero_rpc_scripts.COUNT_READ),
            manifest_key_template=templates["manifest"],
            staging_key_template=templates["staging"],
            job_batches_key_template=templates["job_batches"],
            jobs_key=keys.jobs(),
            ledger_keys=keys.ledger(),
            commit_channel=keys.commit_channel(),
            read_stats_key=keys.read_stats(),
            batch_tag_template=templates["batch_tag"],
            embed_max_bytes=min(limits.chunk_bytes, limits.max_frame_bytes),
            max_header_bytes=limits.max_header_bytes,
            max_ttl_seconds=limits.max_ttl_seconds,
            default_ttl_seconds=store.cfg.default_ttl_seconds,
            overwrite_grace_ms=int(store.cfg.overwrite_grace_seconds * 1000),
            ttl_margin_ms=TTL_MARGIN_MS,
            budget_max_bytes=ledger.max_bytes,
            budget_max_entries=ledger.max_entries,
            value_key_template=templates["value"],
        )

    def commit(
        self,
        ref: BatchRef,
        header: tensor_pb2.BatchHeader,
        gen: str,
        chunks: int,
        *,
        ttl_seconds: int = 0,
        overwrite: bool = True,
    ) -> PutResult:
        """Commits the `chunks` values a client staged under generation `gen`; atomic, like a relayed put."""
        store = self.store
        if not GENERATION_RE.match(gen):
            raise InvalidArgument(
                f"generation = {gen!r} must be 16 lowercase hex digits (a fresh random one per put)", field="generation"
            )
        blob, ttl = store.check_put(ref, header, ttl_seconds)
        total, cb = header.total_bytes, store.limits.chunk_bytes
        want = math.ceil(total / cb)
        member = store.keys.batch_member(ref, gen)
        committed = False
        try:
            if chunks != want:
                raise InvalidArgument(
                    f"chunks = {chunks}, but start.header.total_bytes = {total} in chunks of {cb} bytes makes {want}",
                    field="chunks",
                )
            if not overwrite and store.client.exists(store.keys.manifest(ref)):
                raise AlreadyExists(f"batch {ref} already exists; put with overwrite=True or delete it first")
            staging_ms = store.cfg.staging_ttl_seconds * 1000
            expiry = now_ms() + ttl * 1000 + TTL_MARGIN_MS  # the batch's own: committing needs no settle then
            store.ledger.reserve({member: total + len(blob)}, expiry, f"batch {ref}")
            store._commit_manifest(
                ref, gen, want, total, blob, ttl, overwrite, None, staging_ms, direct=True, rows=row_count(header)
            )
            committed = True
        finally:
            if not committed:  # what the client staged goes, and the budget it may have reserved
                store._discard(ref, gen, max(want, min(chunks, 1 << 16)), member)
        return PutResult(total, want)

    def locate(self, ref: BatchRef, **options: object) -> Located:
        """Where the batch (or its selected columns and rows) lies (meshrl.databuffer.reads.BatchReader.locate)."""
        return self.store.reader.locate(ref, **options)
