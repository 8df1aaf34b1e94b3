"""Sample streams for asynchronous training, on Redis Streams: producers append whole groups
(all n samples of one prompt, with the weight version that produced them); consumers read
through consumer groups with at-least-once delivery, explicit ack, redelivery of groups a dead
consumer left unacked (XAUTOCLAIM after an idle timeout) and a staleness filter whose drops
are acked and counted, never silent. Acked groups are trimmed once every consumer group has
them, and groups older than the stream TTL are trimmed (counted as 'expired').
Used by `DataBuffer` (meshrl.databuffer.store).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.codec import batch_from_proto
from meshrl.common.databuffer_client import StreamStats
from meshrl.common.errors import InvalidArgument, NotFound
from meshrl.databuffer.config import LimitsConfig, StreamConfig
from meshrl.databuffer.indexes import Indexes
from meshrl.databuffer.keys import KeySpace, check_name
from meshrl.databuffer.ledger import Ledger, now_ms
from meshrl.databuffer.stream_scripts import APPEND, CLAIM, DROP, LAG, TRIM

ENTRY_ID_RE = re.compile(r"^\d{1,20}-\d{1,20}$")
TTL_MARGIN_MS = 60_000
RELEASE_IDLE_MS = 30 * 86400 * 1000  # an undelivered overflow entry: claimable by the next reader at once
MAX_GROUPS_PER_READ = 10_000


@dataclass
class Delivered:
    entry_id: str
    group: pb.SampleGroup
    delivery_count: int


@dataclass
class ReadResult:
    groups: list[Delivered]
    dropped_stale: int


def _check_ids(ids: Sequence[str]) -> list[str]:
    for i, entry_id in enumerate(ids):
        if not ENTRY_ID_RE.match(entry_id):
            raise InvalidArgument(
                f"entry_ids[{i}] = {entry_id[:40]!r} is not a stream entry id ('<ms>-<seq>', as ReadGroups returns)",
                field=f"entry_ids[{i}]",
            )
    return list(ids)


class StreamStore:
    def __init__(
        self, client: Any, keys: KeySpace, indexes: Indexes, ledger: Ledger, limits: LimitsConfig, cfg: StreamConfig
    ) -> None:
        self.client = client
        self.keys = keys
        self.indexes = indexes
        self.ledger = ledger
        self.limits = limits
        self.cfg = cfg
        self._known_groups: set[tuple[str, str]] = set()
        self._append = client.register_script(APPEND)
        self._trim = client.register_script(TRIM)
        self._claim = client.register_script(CLAIM)
        self._drop = client.register_script(DROP)
        self._lag = client.register_script(LAG)

    def _keys(self, job_id: str, stream: str) -> list[str]:
        check_name(job_id, "job_id")
        check_name(stream, "stream")
        return [self.keys.stream(job_id, stream), self.keys.stream_meta(job_id, stream)]

    # --- producers ---------------------------------------------------------------------
    def check_groups(self, groups: Sequence[pb.SampleGroup]) -> list[bytes]:
        """Validates every group before anything is written; returns them serialized."""
        if not groups:
            raise InvalidArgument("groups is empty; append at least one group", field="groups")
        blobs, total = [], 0
        for i, group in enumerate(groups):
            where = f"groups[{i}]"
            if not group.group_id or len(group.group_id) > 256:
                raise InvalidArgument(f"{where}.group_id must be 1-256 characters", field=f"{where}.group_id")
            if group.weight_version < 0:
                raise InvalidArgument(
                    f"{where}.weight_version = {group.weight_version} must be >= 0", field=f"{where}.weight_version"
                )
            try:
                rows = batch_from_proto(group.batch).num_rows()
            except InvalidArgument as exc:
                raise InvalidArgument(f"{where}.batch.{exc.message}", field=f"{where}.batch") from None
            if rows == 0:
                raise InvalidArgument(f"{where}.batch has no rows; a group holds its n samples", field=f"{where}.batch")
            blob = group.SerializeToString()
            if len(blob) > self.limits.max_group_bytes:
                raise InvalidArgument(
                    f"{where} is {len(blob)} bytes, over limits.max_group_bytes = {self.limits.max_group_bytes}; "
                    "put large tensors in a keyed batch and reference it",
                    field=where,
                )
            total += len(blob)
            blobs.append(blob)
        if total > self.limits.max_request_bytes:
            raise InvalidArgument(
                f"groups add up to {total} bytes, over limits.max_request_bytes = {self.limits.max_request_bytes}; "
                "append them in several calls",
                field="groups",
            )
        return blobs

    def append(self, job_id: str, stream: str, groups: Sequence[pb.SampleGroup]) -> list[str]:
        keys = self._keys(job_id, stream)
        blobs = self.check_groups(groups)
        ttl_ms = self.cfg.ttl_seconds * 1000
        members = {f"s:{job_id}:{stream}:{secrets.token_hex(8)}": len(b) for b in blobs}
        self.ledger.reserve(members, now_ms() + ttl_ms + TTL_MARGIN_MS, f"{len(blobs)} groups for stream '{stream}'")
        try:
            self.indexes.add_stream(job_id, stream, ttl_ms + TTL_MARGIN_MS)
            args: list[Any] = [ttl_ms + TTL_MARGIN_MS]
            for group, blob, (member, size) in zip(groups, blobs, members.items()):
                args += [group.weight_version, blob, member, size]
            ids = [i.decode() for i in self._append(keys=keys, args=args)]
        except BaseException:
            self.ledger.release(list(members))
            raise
        self._trim_consumed(keys)
        return ids

    # --- consumers -----------------------------------------------------------------------
    def _ensure_group(self, keys: list[str], job_id: str, stream: str, group: str) -> None:
        if (keys[0], group) in self._known_groups:
            return
        try:
            self.client.xgroup_create(keys[0], group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        ttl_ms = self.cfg.ttl_seconds * 1000 + TTL_MARGIN_MS
        if self.client.pttl(keys[0]) == -1:  # created just now by MKSTREAM
            self.client.pexpire(keys[0], ttl_ms)
        self.indexes.add_stream(job_id, stream, ttl_ms)
        self._known_groups.add((keys[0], group))

    def _min_version(self, meta: str, requested: int) -> int:
        if self.cfg.max_version_lag is None:
            return requested
        latest = self.client.hget(meta, "latest")
        return requested if latest is None else max(requested, int(latest) - self.cfg.max_version_lag)

    def read(self, request: pb.ReadGroupsRequest) -> ReadResult:
        """Up to `max_groups` groups for the consumer: claimed from dead consumers, then new ones,
        blocking up to `block_seconds`; groups below `min_weight_version` are acked and counted."""
        keys = self._keys(request.job_id, request.stream)
        check_name(request.consumer_group, "consumer_group")
        check_name(request.consumer, "consumer")
        count = request.max_groups or 1
        if not 1 <= count <= MAX_GROUPS_PER_READ:
            raise InvalidArgument(
                f"max_groups = {request.max_groups} must be in [1, {MAX_GROUPS_PER_READ}]", field="max_groups"
            )
        if request.block_seconds < 0 or request.claim_idle_seconds < 0 or request.min_weight_version < 0:
            raise InvalidArgument(
                "block_seconds, claim_idle_seconds and min_weight_version must be >= 0",
                field="block_seconds" if request.block_seconds < 0 else "claim_idle_seconds",
            )
        try:
            return self._read(keys, request, count)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._known_groups.discard((keys[0], request.consumer_group))  # the stream expired or was deleted
            return self._read(keys, request, count)

    def _read(self, keys: list[str], request: pb.ReadGroupsRequest, count: int) -> ReadResult:
        group, consumer, block_seconds = request.consumer_group, request.consumer, request.block_seconds
        self._ensure_group(keys, request.job_id, request.stream, group)
        min_version = self._min_version(keys[1], request.min_weight_version)
        claim_ms = int((request.claim_idle_seconds or self.cfg.claim_idle_seconds) * 1000)
        entries = [
            (i.decode(), d, int(v), int(n))
            for i, d, v, n in self._claim(keys=[keys[0]], args=[group, consumer, claim_ms, count])
        ]
        if len(entries) < count:
            block = min(block_seconds, self.cfg.max_block_seconds)
            block_ms = int(block * 1000) if block > 0 and not entries else None
            reply = self.client.xreadgroup(group, consumer, {keys[0]: ">"}, count=count - len(entries), block=block_ms)
            for _key, items in reply or []:
                for entry_id, f in items:
                    entries.append((entry_id.decode(), f.get(b"d"), int(f.get(b"v", -1)), 1))
        delivered: list[Delivered] = []
        stale: list[str] = []
        overflow: list[str] = []
        size = 0
        for entry_id, data, version, deliveries in entries:
            if version < min_version:
                stale.append(entry_id)
            elif delivered and size + len(data) > self.limits.max_request_bytes:
                overflow.append(entry_id)
            else:
                size += len(data)
                delivered.append(Delivered(entry_id, pb.SampleGroup.FromString(data), deliveries))
        if overflow:  # over the reply limit: hand them back, claimable by the next read at once
            self.client.xclaim(keys[0], group, consumer, 0, overflow, idle=RELEASE_IDLE_MS, justid=True)
        if stale:
            pipe = self.client.pipeline(transaction=False)
            pipe.xack(keys[0], group, *stale)
            pipe.hincrby(keys[1], "drop:stale", len(stale))
            pipe.execute()
            self._trim_consumed(keys)
        return ReadResult(delivered, len(stale))

    def ack(self, job_id: str, stream: str, group: str, entry_ids: Sequence[str]) -> int:
        keys = self._keys(job_id, stream)
        check_name(group, "consumer_group")
        ids = _check_ids(entry_ids)
        if not ids:
            return 0
        try:
            acked = int(self.client.xack(keys[0], group, *ids))
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):
                raise NotFound(
                    f"consumer group '{group}' does not exist on stream '{stream}' of job '{job_id}'"
                ) from None
            raise
        if acked:
            self._trim_consumed(keys)
        return acked

    def _trim_consumed(self, keys: list[str]) -> None:
        members = self._trim(keys=keys, args=[now_ms(), self.cfg.ttl_seconds * 1000])
        self.ledger.release([m.decode() for m in members])

    # --- jobs and stats ---------------------------------------------------------------------
    def delete(self, job_id: str, stream: str) -> bool:
        keys = self._keys(job_id, stream)
        existed = bool(self.client.exists(keys[0]))
        members = self._drop(keys=keys)
        self.ledger.release([m.decode() for m in members])
        self._known_groups = {k for k in self._known_groups if k[0] != keys[0]}
        return existed

    def delete_job(self, job_id: str) -> int:
        return sum(self.delete(job_id, stream) for stream in self.indexes.streams(job_id))

    def stats(self, job_id: str) -> tuple[list[StreamStats], dict[str, int], int, int]:
        """Per (stream, consumer group) length / pending / lag, drops by reason, groups held and their bytes."""
        out: list[StreamStats] = []
        drops: dict[str, int] = {}
        entries = held = 0
        for stream in self.indexes.streams(job_id):
            key, meta = self._keys(job_id, stream)
            if not self.client.exists(key):
                continue
            length = int(self.client.xlen(key))
            entries += length
            info = {k.decode(): int(v) for k, v in self.client.hgetall(meta).items() if k != b"latest"}
            held += info.get("bytes", 0)
            for name, value in info.items():
                if name.startswith("drop:"):
                    drops[name[5:]] = drops.get(name[5:], 0) + value
            for g in self.client.xinfo_groups(key):
                lag = g.get("lag")
                if lag is None:
                    lag = int(self._lag(keys=[key], args=[g["last-delivered-id"]]))
                out.append(StreamStats(job_id, stream, g["name"].decode(), length, int(g["pending"]), int(lag)))
        return out, drops, entries, held
