"""Receiver-side consumers of a collective weight update (`WeightGroup.receive` drives them).

A sink sees one update as begin(version) -> per bucket [targets(meta)] apply(meta, tensors)...
-> end(version), apply once per part of a bucket as it arrives. Any method may raise to refuse;
the group then drains the rest of the update (so the collective stays in step), reports the
refusal to the sender and re-raises it.
`InPlaceSink` copies into a live model's parameters; `CallbackSink` wraps a plain function.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

import torch

from meshrl.api.common.v1 import weights_pb2

from . import dtypes
from .apply import MAX_LISTED, check_version, find_problems, missing_names, refuse


class WeightSink(ABC):
    """What a receiver does with the tensors of one update; `version` is the last one completed."""

    version: int = -1
    incoming: int = -1

    def begin(self, version: int) -> None:
        """Called when an update starts, before any tensor arrives; raise to refuse the version."""
        self.incoming = version

    def targets(self, meta: weights_pb2.WeightBucketMeta) -> list[torch.Tensor] | None:
        """Optionally the tensors to receive this bucket into directly (spec order, same dtype,
        shape and device as the specs, contiguous); None receives into a staging buffer."""
        return None

    @abstractmethod
    def apply(self, meta: weights_pb2.WeightBucketMeta, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Consumes received tensors of one bucket: called several times per bucket, once per packed
        chunk as it arrives and once for the tensors sent on their own, each tensor exactly once.
        Staged tensors are views of a reused buffer: copy them."""

    def end(self, version: int) -> None:
        """Called after the last bucket; raise if the update was incomplete."""
        self.version = version


class CallbackSink(WeightSink):
    """Calls fn(version, [(name, tensor), ...]) for each bucket (tensors valid only during the call)."""

    def __init__(self, fn: Callable[[int, list[tuple[str, torch.Tensor]]], None]) -> None:
        self.fn = fn

    def apply(self, meta: weights_pb2.WeightBucketMeta, tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.fn(meta.version, tensors)


class InPlaceSink(WeightSink):
    """Copies each bucket into existing parameters (no re-allocation), checking it first.

    named_params: HF name -> live parameter (e.g. dict(model.named_parameters())).
    current_version: the version the replica serves; a lower incoming version is refused
        before anything is received into the model.
    direct: let the group broadcast straight into the parameters when the sender uses the
        per-tensor layout (no staging copy).
    After a successful update `version` is the new version; `touched` says whether a failed
    update changed any parameter (the replica must then be refitted before it serves).
    A bucket's check and its targets are kept for the next update when the group hands over the
    same meta object again (it does for an unchanged bucket, plans.py).
    """

    def __init__(self, named_params: Mapping[str, torch.Tensor], current_version: int, direct: bool = True) -> None:
        self.named_params = named_params
        self.version = current_version
        self.direct = direct
        self.touched = False
        self._seen: set[str] = set()
        self._checked: int | None = None
        self._kept: dict[int, tuple[weights_pb2.WeightBucketMeta, frozenset[str], list[torch.Tensor] | None]] = {}

    def begin(self, version: int) -> None:
        check_version(self.version, version)
        self.incoming = version
        self._seen = set()
        self._checked = None
        self.touched = False

    def _check(self, meta: weights_pb2.WeightBucketMeta) -> None:
        if self._checked == meta.bucket_index:
            return
        kept = self._kept.get(meta.bucket_index)
        if kept is not None and kept[0] is meta and self._seen.isdisjoint(kept[1]):
            self._seen |= kept[1]  # checked in an earlier update, and parameters are never re-allocated
        else:
            specs = [(s.name, dtypes.from_proto(s.dtype, f"tensor {s.name!r}"), tuple(s.shape)) for s in meta.tensors]
            problems, seen = find_problems(self.named_params, specs, self._seen)
            if problems:
                raise refuse(meta.version, problems, self.touched)
            self._kept[meta.bucket_index] = (meta, frozenset(seen - self._seen), None)
            self._seen = seen
        self._checked = meta.bucket_index

    def targets(self, meta: weights_pb2.WeightBucketMeta) -> list[torch.Tensor] | None:
        if not self.direct:
            return None
        self._check(meta)
        kept_meta, names, params = self._kept[meta.bucket_index]
        if params is None:
            params = [self.named_params[s.name] for s in meta.tensors]
            params = [p.detach() for p in params] if all(p.is_contiguous() for p in params) else []
            self._kept[meta.bucket_index] = (kept_meta, names, params)
        if not params:
            return None
        self.touched = True
        return params

    def apply(self, meta: weights_pb2.WeightBucketMeta, tensors: list[tuple[str, torch.Tensor]]) -> None:
        self._check(meta)
        self.touched = True
        with torch.no_grad():
            for name, tensor in tensors:
                param = self.named_params[name]
                if tensor.data_ptr() != param.data_ptr():  # direct targets already hold the data
                    param.copy_(tensor)

    def end(self, version: int) -> None:
        missing = missing_names(self.named_params, self._seen)
        if missing:
            raise refuse(
                version,
                [f"{len(missing)} parameter(s) missing from the update, e.g. {missing[:MAX_LISTED]}"],
                self.touched,
            )
        self.version = version
        self.touched = False


def apply_unless_refused(
    sink: WeightSink, meta: weights_pb2.WeightBucketMeta, tensors: list, refusal: Exception | None
) -> Exception | None:
    """Hands received tensors of a bucket to the sink unless it refused already; returns the refusal."""
    if refusal is None:
        try:
            sink.apply(meta, tensors)
        except Exception as e:
            return e
    return refusal
