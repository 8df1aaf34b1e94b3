"""The address of a batch in the data buffer, as every service names it: `BatchRef` (job, step, node[, shard]),
checked on construction, and its wire form `meshrl.common.v1.BatchKey`.

The only key type: the data buffer stores under it, the scheduler passes it between DAG nodes, the trainer and
the rollout read and write through it. `batch_key(...)` builds the proto of a checked ref.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

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

    def as_dict(self) -> dict:
        """A JSON-ready form, for in-process buses that carry JSON (`BatchRef(**d)` restores it)."""
        return asdict(self)


def batch_key(job_id: str, step: int, node_id: str, shard: int | None = None) -> keys_pb2.BatchKey:
    """The wire key of the checked `BatchRef(job_id, step, node_id, shard)`."""
    return BatchRef(job_id, step, node_id, shard).to_proto()
