"""Names: the checked domain key of a batch (`BatchRef`) and the Redis key layout (`KeySpace`).

Every Redis key carries a hash tag (`{...}`) so that what one script touches lives on one
Redis Cluster shard: a batch's manifest and chunks share `{prefix:b:job:step:node:shard}`,
a stream and its metadata share `{prefix:s:job:stream}`, the budget ledger has its own tag.
Used by the batch store, the stream store and the servicer (proto <-> BatchRef).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshrl.api.common.v1 import keys_pb2
from meshrl.common.errors import InvalidArgument

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
NAME_RULE = "1-128 characters from A-Z a-z 0-9 _ . -"
MAX_STEP = (1 << 53) - 1  # steps are scores of a sorted set (doubles): keep them exact


def check_name(value: str, field: str) -> str:
    """Job ids, node ids, stream, consumer-group and consumer names share one format."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        shown = value if len(str(value)) <= 80 else str(value)[:80] + "..."
        raise InvalidArgument(f"{field} = {shown!r} is not a valid name: use {NAME_RULE}", field=field)
    return value


@dataclass(frozen=True)
class BatchRef:
    """A batch's address: (job, step, node[, shard])."""

    job_id: str
    step: int
    node_id: str
    shard: int | None = None

    def __post_init__(self) -> None:
        check_name(self.job_id, "key.job_id")
        check_name(self.node_id, "key.node_id")
        if not isinstance(self.step, int) or not 0 <= self.step <= MAX_STEP:
            raise InvalidArgument(f"key.step = {self.step!r} must be an integer in [0, 2^53)", field="key.step")
        if self.shard is not None and (not isinstance(self.shard, int) or not 0 <= self.shard < 1 << 31):
            raise InvalidArgument(f"key.shard = {self.shard!r} must be >= 0 (or absent)", field="key.shard")

    @classmethod
    def from_proto(cls, key: keys_pb2.BatchKey, field: str = "key") -> BatchRef:
        if key.has_shard:
            shard: int | None = key.shard
        elif key.shard in (0, -1):
            shard = None
        else:
            raise InvalidArgument(
                f"{field}.shard = {key.shard} but {field}.has_shard is false; set has_shard = true for a sharded "
                "batch or leave shard at -1",
                field=f"{field}.shard",
            )
        try:
            return cls(key.job_id, key.step, key.node_id, shard)
        except InvalidArgument as exc:
            raise InvalidArgument(exc.message.replace("key.", f"{field}.", 1), field=exc.field) from None

    def to_proto(self) -> keys_pb2.BatchKey:
        if self.shard is None:
            return keys_pb2.BatchKey(job_id=self.job_id, step=self.step, node_id=self.node_id, shard=-1)
        return keys_pb2.BatchKey(
            job_id=self.job_id, step=self.step, node_id=self.node_id, shard=self.shard, has_shard=True
        )

    def _order(self) -> tuple[str, int, str, int]:
        return (self.job_id, self.step, self.node_id, -1 if self.shard is None else self.shard)

    def __lt__(self, other: BatchRef) -> bool:
        return self._order() < other._order()

    def index_member(self) -> str:
        return f"{self.step}|{self.node_id}|{-1 if self.shard is None else self.shard}"

    @classmethod
    def from_index_member(cls, job_id: str, member: str | bytes) -> BatchRef:
        text = member.decode() if isinstance(member, bytes) else member
        step, node, shard = text.split("|")
        return cls(job_id, int(step), node, None if shard == "-1" else int(shard))

    def __str__(self) -> str:
        tail = "" if self.shard is None else f"/shard {self.shard}"
        return f"{self.job_id}/step {self.step}/{self.node_id}{tail}"


@dataclass(frozen=True)
class KeySpace:
    """The Redis key layout under one prefix."""

    prefix: str

    # --- batches -------------------------------------------------------------------
    def batch_tag(self, ref: BatchRef) -> str:
        shard = "-" if ref.shard is None else str(ref.shard)
        return f"{self.prefix}:b:{ref.job_id}:{ref.step}:{ref.node_id}:{shard}"

    def manifest(self, ref: BatchRef) -> str:
        return "{" + self.batch_tag(ref) + "}:m"

    def chunk(self, ref: BatchRef, gen: str, index: int) -> str:
        return "{" + self.batch_tag(ref) + f"}}:c:{gen}:{index}"

    def chunks(self, ref: BatchRef, gen: str, count: int) -> list[str]:
        return [self.chunk(ref, gen, i) for i in range(count)]

    def batch_member(self, ref: BatchRef, gen: str) -> str:
        """The budget-ledger entry of one stored generation of a batch."""
        return f"b:{self.batch_tag(ref)}:{gen}"

    # --- per-job indexes -------------------------------------------------------------
    def job_batches(self, job_id: str) -> str:
        return "{" + f"{self.prefix}:j:{job_id}" + "}:batches"

    def job_streams(self, job_id: str) -> str:
        return "{" + f"{self.prefix}:j:{job_id}" + "}:streams"

    def jobs(self) -> str:
        return "{" + f"{self.prefix}:jobs" + "}"

    # --- streams ---------------------------------------------------------------------
    def stream(self, job_id: str, stream: str) -> str:
        return "{" + f"{self.prefix}:s:{job_id}:{stream}" + "}:x"

    def stream_meta(self, job_id: str, stream: str) -> str:
        return "{" + f"{self.prefix}:s:{job_id}:{stream}" + "}:m"

    # --- budget ledger and notifications ------------------------------------------------
    def ledger(self) -> list[str]:
        tag = "{" + f"{self.prefix}:ledger" + "}"
        return [f"{tag}:exp", f"{tag}:size", f"{tag}:tot"]

    def commit_channel(self) -> str:
        return f"{self.prefix}:commits"
