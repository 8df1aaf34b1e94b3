"""The data buffer client's domain types: a stream's sample group as appended and as delivered, a stream
read's result, the buffer's and a stream's statistics, and what a job's or a step's deletion removed.
Re-exported by meshrl.common.databuffer_client, where callers import them from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.codec import Batch, batch_to_proto


@dataclass
class Group:
    """All n samples of one prompt, appended to a stream together. `batch`: one row per sample."""

    group_id: str
    weight_version: int
    batch: Batch | Mapping[str, Any]

    def to_proto(self) -> pb.SampleGroup:
        batch = self.batch if isinstance(self.batch, Batch) else Batch(dict(self.batch))
        return pb.SampleGroup(group_id=self.group_id, weight_version=self.weight_version, batch=batch_to_proto(batch))


@dataclass
class DeliveredGroup:
    entry_id: str  # pass it to ack()
    group_id: str
    weight_version: int
    batch: Batch
    delivery_count: int  # > 1: redelivered (a consumer died before acking)


@dataclass
class ReadResult:
    groups: list[DeliveredGroup]
    dropped_stale: int  # groups under the staleness bound: acked and counted by the service


@dataclass
class StreamStats:
    job_id: str
    stream: str
    consumer_group: str
    length: int
    pending: int
    lag: int


@dataclass
class BufferStats:
    batches: int
    bytes: int
    streams: list[StreamStats] = field(default_factory=list)
    drops_by_reason: dict[str, int] = field(default_factory=dict)
    budget_bytes: int = 0
    budget_entries: int = 0
    get_calls: int = 0  # GetBatch calls the service process served since it started, and what they sent
    get_bytes: int = 0
    get_rows: int = 0


class JobDeletion(NamedTuple):
    batches: int
    streams: int


class StepDeletion(NamedTuple):
    batches: int
    job_bytes_before: int  # GetStats(job).bytes just before the delete
