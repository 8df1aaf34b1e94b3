"""What each side of a weight group keeps between updates about each bucket, so an update whose
buckets hold the same tensors (names, dtypes, shapes) as the last one skips rebuilding them.

Sender (`SendPlans`): a bucket's WeightBucketMeta bytes (without the version, wire.py) and its
layout, per coalescing threshold, kept while the bucket's names, dtypes and shapes stay the same.
Receiver (`ReceivePlans`): the parsed meta, kept while the header carries the same meta bytes, its
layout per threshold, and the views the bucket is received into, kept while the sink offers the
very same targets and the staging buffer is the same. The same meta object is handed to the sink for an unchanged
bucket, so a sink may keep its own checks keyed on it (sink.InPlaceSink does). `ReceivePlans.checked` reads a
bucket's header against the stream (version, index, kind, sizes) before any byte of it is received. Used by
`collective.py`; nothing here is shared between groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import Aborted, DataLoss

from .buckets import Bucket, bucket_specs
from .transport import CollectiveFailed
from .wire import ABORT, BUCKET, END, FAILED, LAST, BucketLayout, decode_header


@dataclass(frozen=True)
class SendPlan:
    meta_bytes: bytes
    lay: BucketLayout


class SendPlans:
    """The sender's plan of each bucket index, rebuilt only when the bucket's tensors change."""

    def __init__(self) -> None:
        self._plans: dict[tuple[int, int], tuple[tuple, SendPlan]] = {}  # (index, threshold) ->

    def get(self, index: int, bucket: Bucket, last: bool, threshold: int) -> SendPlan:
        key = (last, tuple((name, t.dtype, t.shape) for name, t in bucket))
        hit = self._plans.get((index, threshold))
        if hit is not None and hit[0] == key:
            return hit[1]
        specs = bucket_specs(bucket)  # refuses an unsupported dtype before anything is kept
        meta = weights_pb2.WeightBucketMeta(bucket_index=index, tensors=specs, num_buckets=index + 1 if last else 0)
        plan = SendPlan(meta.SerializeToString(), BucketLayout.of(specs, threshold))
        self._plans[(index, threshold)] = (key, plan)
        return plan


class ReceivePlans:
    """The receiver's parsed meta of each bucket index, and its layout and receive views per
    coalescing threshold (a sender may switch layouts between updates; the meta stays the same)."""

    def __init__(self) -> None:
        self._metas: dict[int, tuple[bytes, weights_pb2.WeightBucketMeta]] = {}
        self._lays: dict[tuple[int, int], tuple[weights_pb2.WeightBucketMeta, BucketLayout]] = {}
        self._views: dict[int, list[tuple]] = {}  # index -> [(lay, targets, staging, wire, named)], 2 at most

    def meta(
        self, index: int, meta_bytes: bytes, threshold: int, version: int
    ) -> tuple[weights_pb2.WeightBucketMeta, BucketLayout | None]:
        """The bucket's meta (version set) and its layout when it was built before for this very
        meta and threshold (else None: the caller checks the meta first, then calls `layout`).
        Raises what FromString raises."""
        hit = self._metas.get(index)
        if hit is not None and hit[0] == meta_bytes:
            meta = hit[1]
        else:
            meta = weights_pb2.WeightBucketMeta.FromString(meta_bytes)
            self._metas[index] = (meta_bytes, meta)
        meta.version = version
        lay = self._lays.get((index, threshold))
        return meta, lay[1] if lay is not None and lay[0] is meta else None

    def layout(self, index: int, threshold: int, meta: weights_pb2.WeightBucketMeta) -> BucketLayout:
        lay = BucketLayout.of(list(meta.tensors), threshold)
        self._lays[(index, threshold)] = (meta, lay)
        return lay

    def views(
        self, index: int, lay: BucketLayout, staging: torch.Tensor, targets: Sequence[torch.Tensor] | None
    ) -> tuple[list[torch.Tensor], list[tuple[str, torch.Tensor]]]:
        """lay.receiver_wire(staging, targets), reused while the layout, the staging buffer and the
        targets are the same objects as in one of the last two updates (one per layout)."""
        kept = self._views.setdefault(index, [])
        for v in kept:
            if v[0] is lay and v[1] is targets and v[2] is staging:
                return v[3], v[4]
        wire, named = lay.receiver_wire(staging, targets)
        kept.append((lay, targets, staging, wire, named))
        del kept[:-2]
        return wire, named

    def checked(
        self, header: bytes, version: int, index: int, what: str
    ) -> tuple[int, weights_pb2.WeightBucketMeta, BucketLayout | None]:
        """(kind, meta, layout: None for an end marker) of bucket <index>'s header, checked against the stream:
        DataLoss for a header that cannot be trusted (the caller's group is then unusable), Aborted when the
        trainer dropped the update, CollectiveFailed when its side of the broadcast broke."""
        kind, got, raw, payload, threshold = decode_header(header)
        try:
            meta, lay = self.meta(index, raw, threshold, got)
        except Exception as e:
            raise DataLoss(f"{what}: unreadable bucket metadata ({e}); re-create the group") from e
        if kind == ABORT:
            raise Aborted(f"the trainer aborted update {version} after {index} buckets (its export failed)")
        if kind == FAILED:
            raise CollectiveFailed(f"{what}: the trainer's side of the broadcast failed", False)
        if got != version or meta.bucket_index != index or kind not in (BUCKET, LAST, END):
            raise DataLoss(
                f"{what}: inconsistent stream (kind {kind}, version {got}, meta {meta}); re-create the group"
            )
        expected = {END: index, LAST: index + 1}.get(kind)
        if expected is not None and meta.num_buckets != expected:
            raise DataLoss(f"update {version}: the last header says {meta.num_buckets} buckets, got {expected}")
        if kind != END and lay is None:
            lay = self.layout(index, threshold, meta)
        if kind != END and payload != lay.payload:
            raise DataLoss(f"{what} carries {payload} bytes, its specs need {lay.payload}")
        return kind, meta, lay

    def clear(self) -> None:
        self._metas.clear()
        self._lays.clear()
        self._views.clear()
