"""Delta weight versions over a weight group: the encoded delta of delta.py broadcast as two uint8 tensors.

Trainer: `delta_update(base, version, export, max_fraction)` encodes the export against the base both
sides hold (delta_codec.py, the same encoding as on disk) and returns the tensors to `WeightGroup.send`:
the delta manifest (delta_manifest.py: base version, per-tensor sha256 of the new bytes) and the blobs.
It returns None when the delta would exceed `max_fraction` of a complete version (the base then holds
`version`; the caller sends `base.tensors` in full).
Replica: `DeltaOrFullSink` receives either kind of update. A complete one goes straight into the
parameters (its `on_full` callback runs once, before the first tensor lands: the engine pauses there);
a delta goes into host memory while the engine generates, and is checked and decoded in `end()`
(BaseMismatch when this replica does not serve the base, DataLoss when corrupt: reported to the trainer
as a refusal, parameters untouched). The engine then pauses only for `apply_delta(params, sink.staged)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import DataLoss, InvalidArgument

from .buckets import NamedTensor
from .delta import DeltaBase, DeltaStats, StagedDelta, check_delta, decode_delta, encode_within
from .delta_manifest import DeltaManifest
from .sink import InPlaceSink, WeightSink

MANIFEST_TENSOR = "meshrl.delta/manifest.json"
DATA_TENSOR = "meshrl.delta/data"
WIRE_NAMES = frozenset((MANIFEST_TENSOR, DATA_TENSOR))


def _bytes_tensor(raw: bytes) -> torch.Tensor:
    """A flat uint8 tensor of `raw` (one byte of padding when empty: a broadcast needs a byte)."""
    return torch.frombuffer(bytearray(raw or b"\0"), dtype=torch.uint8)


def delta_update(
    base: DeltaBase, version: int, tensors: Iterable, max_fraction: float
) -> tuple[list[NamedTensor] | None, DeltaStats]:
    """The two tensors that carry `version` as a delta against `base` (which then holds `version`), or
    (None, stats) when the delta exceeds `max_fraction` of a complete version. FailedPrecondition (base
    dropped) when no usable base is held or the export's tensors differ from the base's."""
    manifest, blobs, stats = encode_within(base, version, tensors, max_fraction)
    if manifest is None:
        return None, stats
    return [(MANIFEST_TENSOR, _bytes_tensor(manifest.to_json())), (DATA_TENSOR, _bytes_tensor(b"".join(blobs)))], stats


class DeltaOrFullSink(WeightSink):
    """Receives a complete update through `full` (in place, after `on_full()`), or a delta into host memory,
    decoded against `full.named_params` in `end()`: then `staged` holds it, to be applied by the caller."""

    def __init__(self, full: InPlaceSink, on_full: Callable[[], None]) -> None:
        self.full = full
        self.on_full = on_full
        self.version = full.version
        self.is_delta: bool | None = None
        self.staged: StagedDelta | None = None
        self._parts: dict[str, torch.Tensor] = {}

    def begin(self, version: int) -> None:
        self.full.begin(version)
        self.incoming = version
        self.is_delta, self.staged, self._parts = None, None, {}

    def _delta(self, meta: weights_pb2.WeightBucketMeta) -> bool:
        names = {s.name for s in meta.tensors}
        if self.is_delta is None:
            self.is_delta = bool(names & WIRE_NAMES)
            if not self.is_delta:
                self.on_full()
        if self.is_delta and not names <= WIRE_NAMES:
            raise InvalidArgument(f"update {meta.version} mixes delta tensors with {sorted(names - WIRE_NAMES)[:3]}")
        return self.is_delta

    def targets(self, meta: weights_pb2.WeightBucketMeta) -> list[torch.Tensor] | None:
        return None if self._delta(meta) else self.full.targets(meta)

    def apply(self, meta: weights_pb2.WeightBucketMeta, tensors: list[tuple[str, torch.Tensor]]) -> None:
        if not self._delta(meta):
            self.full.apply(meta, tensors)
            return
        for name, tensor in tensors:
            self._parts[name] = tensor.detach().to("cpu", copy=True)

    def end(self, version: int) -> None:
        if not self.is_delta:
            self.full.end(version)
            self.version = version
            return
        missing = sorted(WIRE_NAMES - set(self._parts))
        if missing:
            raise DataLoss(f"delta update {version} arrived without {missing}; the trainer's stream is broken")
        where = f"delta update {version}"
        raw = self._parts[MANIFEST_TENSOR].numpy().tobytes()
        manifest = DeltaManifest.parse(raw, where)
        if manifest.version != version:
            raise InvalidArgument(f"{where} carries a manifest of version {manifest.version}")
        data = memoryview(self._parts[DATA_TENSOR].numpy())
        if len(data) < manifest.data_bytes:
            raise DataLoss(f"{where} carries {len(data)} data bytes, its manifest needs {manifest.data_bytes}")
        check_delta(self.full.named_params, manifest, self.full.version)
        self.staged = decode_delta(self.full.named_params, manifest, lambda e: data[e.begin : e.end], where)
