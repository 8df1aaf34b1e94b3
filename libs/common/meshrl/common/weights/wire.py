"""What one bucket looks like on the collective: its header, and which bytes travel how.

Used by `collective.py` on both sides. Every bucket is announced through the group's store
(rendezvous.py), not the collective: a header [kind, payload bytes, coalesce threshold, version]
and its WeightBucketMeta bytes, so the backend carries nothing but tensor bytes and the sender
never waits for a receiver to take a small message. The meta bytes leave the version out, so an
unchanged bucket's are the same in every update and both sides keep what they built from them
(plans.py). The first bucket's header is the update's announcement, and the last bucket's says
so (kind LAST), so an update of one bucket costs one store value.
Then the tensors below the threshold travel packed in one flat buffer (offsets from `buckets.layout`,
in meta order) sent in chunks, a small first one (FIRST_CHUNK_BYTES, quick to pack) and then about
PACK_CHUNK_BYTES each: the sender packs a chunk while the one before it travels, the receiver copies
a chunk out while the next arrives. Each tensor of at least the threshold follows on its own,
straight from the sender's tensor into the receiver's parameter when the receiver's sink offers it
(no copies), so the receiver's last copy-out overlaps their transfer and nothing is left to copy
when the last byte lands.
The "flat" layout is the same with an infinite threshold: one packed buffer per bucket.
The threshold rides in the header, so receivers always follow the sender's choice.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from meshrl.api.common.v1 import tensor_pb2, weights_pb2

from . import dtypes
from .buckets import Bucket, align_up, layout, pack, unpack

BUCKET, LAST, END, ABORT, FAILED = 1, 2, 3, 4, 5  # LAST: no end marker follows; FAILED: the sender's collective broke
_HEADER = struct.Struct("<bqqq")
FLAT_THRESHOLD = 1 << 62  # everything coalesced: one broadcast per bucket
# Measured side by side (bench/weights/run.py --coalesce-kb, gloo, 2 processes, bf16, 2 loaded cores):
# with the packed buffer sent last (packed while the large tensors travel), 512 KiB beat 256 KiB at
# 10M parameters in 5 of 5 runs (median ratio to a raw broadcast 0.90-1.65 vs 1.13-1.83: 3 broadcasts
# instead of 24); at 100M and up every matrix is above both, so they are the same there. Earlier, with
# the packed buffer first, 256 KiB had beaten 1 MiB (copies on each side cost more than broadcasts).
DEFAULT_COALESCE_BYTES = 512 << 10
# Chunks of the packed buffer (bench/weights at 10M, 3 alternations each, 2 loaded cores): one buffer
# 1.49/1.49/1.36 x raw vs 4 MiB chunks 1.29/1.41/1.31; 2 and 8 MiB were not told apart from 4 MiB.
PACK_CHUNK_BYTES = 4 << 20
FIRST_CHUNK_BYTES = 256 << 10  # nothing travels until the first chunk is packed
# Order (alternating in the same two processes, gloo, bf16, 2 loaded cores, 40 updates each): packed chunks
# first, then the large tensors, 1.32-1.70x a raw broadcast at 10M parameters in 4 of 4 runs against
# 1.52-1.94x for the large tensors first (the receiver's last copy-out no longer waits after the last byte);
# 1.27 against 1.25 at 100M (not told apart).


@dataclass(frozen=True)
class BucketLayout:
    """specs: the bucket's tensors in meta order. packed: indices of tensors coalesced into one
    buffer of packed_total bytes; direct: indices sent one by one, staged (when the receiver has
    no direct target) at direct_offsets after the packed part; payload: bytes on the wire;
    chunks: (first, end) positions in `packed` and (start, end) bytes of each packed chunk."""

    specs: Sequence[tensor_pb2.TensorSpec]
    packed: tuple[int, ...]
    direct: tuple[int, ...]
    packed_total: int
    direct_offsets: tuple[int, ...]
    staging_total: int
    payload: int
    chunks: tuple[tuple[int, int, int, int], ...] = ()

    @staticmethod
    def of(specs: Sequence[tensor_pb2.TensorSpec], threshold: int) -> BucketLayout:
        packed = tuple(i for i, s in enumerate(specs) if s.nbytes < threshold or s.nbytes == 0)
        direct = tuple(i for i, s in enumerate(specs) if not (s.nbytes < threshold or s.nbytes == 0))
        starts, packed_total = layout([specs[i] for i in packed])
        chunks: list[tuple[int, int, int, int]] = []
        first = 0
        for p in range(1, len(packed) + 1):  # cut once a chunk holds FIRST_CHUNK_BYTES, then PACK_CHUNK_BYTES
            if p == len(packed) or starts[p] - starts[first] >= (PACK_CHUNK_BYTES if chunks else FIRST_CHUNK_BYTES):
                end = starts[p] if p < len(packed) else packed_total
                if end > starts[first]:
                    chunks.append((first, p, starts[first], end))
                elif chunks:  # empty tensors at the end ride with the chunk before (no empty broadcast)
                    chunks[-1] = (chunks[-1][0], p, chunks[-1][2], chunks[-1][3])
                first = p
        offsets, end = [], align_up(packed_total)
        for i in direct:
            offsets.append(end)
            end = align_up(end + specs[i].nbytes)
        payload = packed_total + sum(specs[i].nbytes for i in direct)
        return BucketLayout(specs, packed, direct, packed_total, tuple(offsets), end, payload, tuple(chunks))

    def direct_wire(self, bucket: Bucket, device: torch.device) -> list[torch.Tensor]:
        """The uint8 tensors the sender broadcasts after the packed chunks, one per large tensor, in order: each
        tensor's own memory when it is contiguous on `device`, else a copy there."""
        wire = []
        for i in self.direct:
            t = bucket[i][1].detach()
            if t.device != device or not t.is_contiguous():
                t = t.to(device).contiguous()
            wire.append(t.reshape(-1).view(torch.uint8))
        return wire

    def packed_wire(self, bucket: Bucket, buffer: Callable[[int], torch.Tensor]) -> Iterator[torch.Tensor]:
        """The packed small tensors the sender broadcasts first, one chunk at a time (each packed
        when it is asked for, so the caller can start sending it before packing the next)."""
        if not self.packed_total:
            return
        flat = buffer(self.packed_total)
        for first, end, start, stop in self.chunks:
            idx = self.packed[first:end]
            pack([bucket[i] for i in idx], [self.specs[i] for i in idx], flat[start:stop])
            yield flat[start:stop]

    def receiver_wire(
        self, staging: torch.Tensor, targets: Sequence[torch.Tensor] | None
    ) -> tuple[list[torch.Tensor], list[tuple[str, torch.Tensor]]]:
        """The uint8 tensors to receive into (mirroring packed_wire then direct_wire) and the named
        tensors they fill."""
        named: list[tuple[str, torch.Tensor] | None] = [None] * len(self.specs)
        region = staging[: self.packed_total]
        wire = [region[start:stop] for _, _, start, stop in self.chunks]
        for i, item in zip(self.packed, unpack(region, [self.specs[i] for i in self.packed]), strict=True):
            named[i] = item
        for i, offset in zip(self.direct, self.direct_offsets, strict=True):
            spec = self.specs[i]
            if targets is not None:
                tensor = targets[i]
            else:
                dtype = dtypes.from_proto(spec.dtype, f"tensor {spec.name!r}")
                tensor = staging[offset : offset + spec.nbytes].view(dtype).view(tuple(spec.shape))
            wire.append(tensor.reshape(-1).view(torch.uint8))
            named[i] = (spec.name, tensor)
        return wire, named  # type: ignore[return-value]

    def staging_bytes(self, direct_targets: bool) -> int:
        return self.packed_total if direct_targets else self.staging_total


def fit_targets(
    targets: Sequence[torch.Tensor] | None, lay: BucketLayout, device: torch.device
) -> Sequence[torch.Tensor] | None:
    """A sink's direct targets if each one sent directly matches its spec exactly, else None."""
    if targets is None or len(targets) != len(lay.specs):
        return None
    for i in lay.direct:
        t, s = targets[i], lay.specs[i]
        if t.device != device or not t.is_contiguous() or t.dtype != dtypes.from_proto(s.dtype):
            return None
        if list(t.shape) != list(s.shape):
            return None
    return targets


def encode_header(kind: int, meta: weights_pb2.WeightBucketMeta, payload: int, threshold: int) -> bytes:
    """A bucket's header as the store carries it (see header_bytes)."""
    version, meta_bytes = meta.version, b""
    if version:
        meta = weights_pb2.WeightBucketMeta(
            bucket_index=meta.bucket_index, tensors=meta.tensors, num_buckets=meta.num_buckets
        )
    meta_bytes = meta.SerializeToString()
    return header_bytes(kind, version, meta_bytes, payload, threshold)


def header_bytes(kind: int, version: int, meta_bytes: bytes, payload: int, threshold: int) -> bytes:
    """[kind, payload bytes, threshold, version] then the bytes of a WeightBucketMeta without its version."""
    return _HEADER.pack(kind, payload, threshold, version) + meta_bytes


def decode_header(raw: bytes) -> tuple[int, int, bytes, int, int]:
    """(kind, version, WeightBucketMeta bytes without the version, payload bytes, coalesce threshold)
    of a stored header; kind 0 when the value is too short to be one (the caller reports the stream
    as inconsistent)."""
    if len(raw) < _HEADER.size:
        return 0, 0, b"", 0, 0
    kind, payload, threshold, version = _HEADER.unpack_from(raw)
    return kind, version, raw[_HEADER.size :], payload, threshold
