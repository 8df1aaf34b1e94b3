"""What each side of a weight group keeps between updates about each bucket, so an update whose
buckets hold the same tensors (names, dtypes, shapes) as the last one skips rebuilding them.

Sender (`SendPlans`): a bucket's WeightBucketMeta bytes (without the version, wire.py) and its
layout, kept while the bucket's names, dtypes and shapes stay the same. Receiver
(`ReceivePlans`): the parsed meta and layout, kept while the header carries the same meta bytes,
and the views the bucket is received into, kept while the sink offers the very same targets and
the staging buffer is the same. The same meta object is handed to the sink for an unchanged
bucket, so a sink may keep its own checks keyed on it (sink.InPlaceSink does). Used by
`collective.py`; nothing here is shared between groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from meshrl.api.common.v1 import weights_pb2

from .buckets import Bucket, bucket_specs
from .wire import BucketLayout


@dataclass(frozen=True)
class SendPlan:
    meta_bytes: bytes
    lay: BucketLayout


class SendPlans:
    """The sender's plan of each bucket index, rebuilt only when the bucket's tensors change."""

    def __init__(self) -> None:
        self._plans: dict[int, tuple[tuple, SendPlan]] = {}

    def get(self, index: int, bucket: Bucket, last: bool, threshold: int) -> SendPlan:
        key = (last, threshold, tuple((name, t.dtype, t.shape) for name, t in bucket))
        hit = self._plans.get(index)
        if hit is not None and hit[0] == key:
            return hit[1]
        specs = bucket_specs(bucket)  # refuses an unsupported dtype before anything is kept
        meta = weights_pb2.WeightBucketMeta(bucket_index=index, tensors=specs, num_buckets=index + 1 if last else 0)
        plan = SendPlan(meta.SerializeToString(), BucketLayout.of(specs, threshold))
        self._plans[index] = (key, plan)
        return plan


@dataclass
class _Received:
    meta_bytes: bytes
    threshold: int
    meta: weights_pb2.WeightBucketMeta
    lay: BucketLayout
    views: tuple | None = None  # (targets, staging, wire, named) of the last receive into it


class ReceivePlans:
    """The receiver's parsed header and receive views of each bucket index."""

    def __init__(self) -> None:
        self._plans: dict[int, _Received] = {}

    def meta(
        self, index: int, meta_bytes: bytes, threshold: int, version: int
    ) -> tuple[weights_pb2.WeightBucketMeta, BucketLayout | None]:
        """The bucket's meta (version set) and, when it was seen before, its layout (else None:
        the caller checks the meta first, then calls `layout`). Raises what FromString raises."""
        hit = self._plans.get(index)
        if hit is not None and hit.meta_bytes == meta_bytes and hit.threshold == threshold:
            hit.meta.version = version
            return hit.meta, hit.lay
        meta = weights_pb2.WeightBucketMeta.FromString(meta_bytes)
        meta.version = version
        self._plans.pop(index, None)
        return meta, None

    def layout(self, index: int, meta_bytes: bytes, threshold: int, meta: weights_pb2.WeightBucketMeta) -> BucketLayout:
        lay = BucketLayout.of(list(meta.tensors), threshold)
        self._plans[index] = _Received(meta_bytes, threshold, meta, lay)
        return lay

    def views(
        self, index: int, staging: torch.Tensor, targets: Sequence[torch.Tensor] | None
    ) -> tuple[list[torch.Tensor], list[tuple[str, torch.Tensor]]]:
        """lay.receiver_wire(staging, targets), reused while both are the same objects as last time."""
        plan = self._plans[index]
        v = plan.views
        if v is not None and v[0] is targets and v[1] is staging:
            return v[2], v[3]
        wire, named = plan.lay.receiver_wire(staging, targets)
        plan.views = (targets, staging, wire, named)
        return wire, named

    def clear(self) -> None:
        self._plans.clear()
