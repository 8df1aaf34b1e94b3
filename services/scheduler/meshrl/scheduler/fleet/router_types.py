"""The rollout router's vocabulary: sampling parameters from a mapping, the router's view of a replica, what a
batch or a stream call returns, and the prompt ranges a batch is split into. Used by `fleet/router.py`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from meshrl.api.common.v1 import keys_pb2
from meshrl.api.rollout.v1 import rollout_pb2 as pb
from meshrl.common.errors import InvalidArgument, Unavailable
from meshrl.common.registry import SERVING
from meshrl.common.suggest import did_you_mean

# Failures after which the same work is tried on another replica; anything else is the caller's error.
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED, grpc.StatusCode.UNKNOWN)
SAMPLING_KEYS = [f.name for f in pb.SamplingParams.DESCRIPTOR.fields]


class StaleFleet(Unavailable):
    """No serving replica has the job's weight version (UNAVAILABLE): the job refits the replicas or restarts."""


class _Behind(Exception):
    """A stream's first tokens came from weights older than the router's floor (retried on another replica)."""

    def __init__(self, version: int) -> None:
        super().__init__(f"weight version {version}")
        self.version = version


def sampling_params(values: pb.SamplingParams | Mapping[str, Any]) -> pb.SamplingParams:
    """A SamplingParams proto from a proto or a dict; an unknown key is INVALID_ARGUMENT naming the closest."""
    if isinstance(values, pb.SamplingParams):
        return values
    for key in values:
        if key not in SAMPLING_KEYS:
            hint = did_you_mean(key, SAMPLING_KEYS, f"known keys: {', '.join(SAMPLING_KEYS)}")
            raise InvalidArgument(f"unknown sampling key '{key}': {hint}", field=f"sampling.{key}")
    try:
        return pb.SamplingParams(**{k: v for k, v in values.items() if v is not None})
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"bad sampling parameters {dict(values)}: {exc}") from None


@dataclass
class Replica:
    """The router's view of one replica: where it is and the work this router has in flight there."""

    replica_id: str
    address: str
    capacity: int = 64
    state: str = SERVING
    weight_version: int = 0
    outstanding: int = 0  # samples in flight from this router
    calls: int = 0
    failed_at: float = 0.0  # monotonic time the router last saw it fail (0 = healthy)
    channel: grpc.Channel | None = field(default=None, repr=False)
    stub: Any = field(default=None, repr=False)

    def load(self, extra: int = 0) -> float:
        return (self.outstanding + extra) / max(1, self.capacity)


@dataclass
class BatchResult:
    keys: list[keys_pb2.BatchKey]  # where the samples are: [output] (merged) or the shards in order
    samples: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    min_weight_version: int = 0
    max_weight_version: int = 0
    samples_by_replica: dict[str, int] = field(default_factory=dict)
    retries: int = 0


@dataclass
class StreamResult:
    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]
    finish_reason: int
    text: str
    replica_id: str


@dataclass
class _Chunk:
    index: int
    begin: int
    end: int
    attempts: int = 0
    excluded: set[str] = field(default_factory=set)

    def shard_key(self, output_key: keys_pb2.BatchKey, single: bool) -> keys_pb2.BatchKey:
        """Where this range's samples go: the output key itself when the batch is one range, else its shard."""
        if single:
            return output_key
        key = keys_pb2.BatchKey()
        key.CopyFrom(output_key)
        key.shard, key.has_shard = self.index, True
        return key


def plan_chunks(num_prompts: int, n: int, chunk_prompts: int | None, capacities: list[int]) -> list[_Chunk]:
    """Prompt ranges of a batch: one per live replica (at most what the smallest can hold at n samples each),
    or `chunk_prompts` prompts each when given."""
    if chunk_prompts is None:
        if len(capacities) == 1:
            chunk_prompts = num_prompts
        else:
            chunk_prompts = max(1, min(math.ceil(num_prompts / len(capacities)), max(1, min(capacities) // n)))
    return [
        _Chunk(i, b, min(b + chunk_prompts, num_prompts)) for i, b in enumerate(range(0, num_prompts, chunk_prompts))
    ]


def summarize(result: BatchResult, replies: list[pb.GenerateBatchResponse]) -> None:
    """Token counts and the weight-version span of the ranges' replies, in `result`."""
    result.samples = sum(r.samples for r in replies)
    result.prompt_tokens = sum(r.prompt_tokens for r in replies)
    result.generated_tokens = sum(r.generated_tokens for r in replies)
    result.min_weight_version = min(r.min_weight_version for r in replies)
    result.max_weight_version = max(r.max_weight_version for r in replies)


def checked_stream(chunks: Iterator[pb.GenerateChunk], floor: int) -> Iterator[pb.GenerateChunk]:
    """A stream's chunks, held back until one carries weight versions; `_Behind` (and the stream cancelled)
    when those are older than `floor`. Only the first tokens are checked: in async modes weights change
    mid-response, and a replica restarted mid-response breaks its stream anyway."""
    held: list[pb.GenerateChunk] | None = []
    for chunk in chunks:
        if held is None:
            yield chunk
            continue
        if chunk.weight_versions and min(chunk.weight_versions) < floor:
            if hasattr(chunks, "cancel"):
                chunks.cancel()
            raise _Behind(min(chunk.weight_versions))
        held.append(chunk)
        if chunk.weight_versions:
            yield from held
            held = None
    yield from held or ()  # no tokens at all: nothing made with old weights
