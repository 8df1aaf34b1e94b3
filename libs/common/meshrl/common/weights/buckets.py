"""Bucketing of named weight tensors and the flat byte layout of one bucket.

The trainer's export yields (HF name, tensor) pairs lazily; `iter_buckets` groups them into
buckets of about `bucket_bytes` without materialising more than one bucket. A bucket travels
(collective transport) or is stored (disk transport) as one flat uint8 buffer in which every
tensor starts at a multiple of ALIGN bytes, in bucket order; sender and receiver derive the
offsets from the specs alone. Used by `disk.py` and `collective.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain

import torch

from meshrl.api.common.v1 import tensor_pb2
from meshrl.common.errors import InvalidArgument

from . import dtypes

DEFAULT_BUCKET_BYTES = 512 * 1024**2
ALIGN = 64  # bytes; keeps every tensor view naturally aligned for any dtype

NamedTensor = tuple[str, torch.Tensor]
Bucket = Sequence[NamedTensor]
Export = Iterable[NamedTensor] | Iterable[Bucket]  # what a sender sends: pairs in export order, or buckets


def align_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


def iter_buckets(
    named_tensors: Iterable[NamedTensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[list[NamedTensor]]:
    """Groups tensors in order into buckets of at most `bucket_bytes` (a bigger tensor gets its own).

    Raises InvalidArgument for a duplicate name or a non-positive bucket size.
    """
    return (bucket for bucket, _ in _marked(named_tensors, bucket_bytes))


def _marked(named_tensors: Iterable[NamedTensor], bucket_bytes: int) -> Iterator[tuple[list[NamedTensor], bool]]:
    """iter_buckets' buckets, each with whether it is the last: known without reading ahead, since
    a bucket is only closed by the next tensor or by the end of the export."""
    if bucket_bytes <= 0:
        raise InvalidArgument(f"bucket_bytes must be positive, got {bucket_bytes}; 512 MiB is the default")
    seen: set[str] = set()
    bucket: list[NamedTensor] = []
    size = 0
    for name, tensor in named_tensors:
        if name in seen:
            raise InvalidArgument(f"tensor {name!r} appears twice in the export; every HF name must be unique")
        seen.add(name)
        nbytes = align_up(tensor.numel() * tensor.element_size())
        if bucket and size + nbytes > bucket_bytes:
            yield bucket, False
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket, True


def as_buckets(tensors: Export, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[Sequence[NamedTensor]]:
    """Accepts (name, tensor) pairs (bucketed here) or ready-made buckets; refuses an empty export now."""
    return (bucket for bucket, _ in marked_buckets(tensors, bucket_bytes))


def marked_buckets(tensors: Export, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[tuple[Bucket, bool]]:
    """as_buckets' buckets, each with whether it is known to be the last: always for (name, tensor)
    pairs and for a list of buckets; never for a lazy iterable of buckets (reading one ahead would
    hold two buckets in memory), whose end the caller learns only when it is exhausted.
    Refuses an empty export now."""
    known = len(tensors) if isinstance(tensors, Sequence) else None
    it = iter(tensors)
    first = next(it, None)
    if first is None:
        raise InvalidArgument("the export holds no tensors; a weight version needs at least one")
    rest = chain([first], it)
    if (
        isinstance(first, tuple)
        and len(first) == 2
        and isinstance(first[0], str)
        and isinstance(first[1], torch.Tensor)
    ):
        return _marked(rest, bucket_bytes)
    return ((bucket, known is not None and i == known - 1) for i, bucket in enumerate(rest))


def bucket_specs(bucket: Bucket) -> list[tensor_pb2.TensorSpec]:
    return [dtypes.tensor_spec(name, tensor) for name, tensor in bucket]


def layout(specs: Sequence[tensor_pb2.TensorSpec]) -> tuple[list[int], int]:
    """Byte offset of each tensor in the flat buffer, and the buffer's total length."""
    offsets: list[int] = []
    total = 0
    for spec in specs:
        offsets.append(total)
        total = align_up(total + spec.nbytes)
    return offsets, total


def pack(bucket: Bucket, specs: Sequence[tensor_pb2.TensorSpec], out: torch.Tensor) -> torch.Tensor:
    """Copies the bucket's tensors into `out` (uint8, at least the layout's length, on any device).

    Returns the used prefix of `out`. Strided or other-device sources are copied directly.
    """
    offsets, total = layout(specs)
    if out.dtype != torch.uint8 or out.numel() < total:
        raise InvalidArgument(f"pack buffer must be uint8 with at least {total} bytes, got {out.dtype} [{out.numel()}]")
    for (_, tensor), spec, offset in zip(bucket, specs, offsets, strict=True):
        if spec.nbytes:
            _view(out, offset, spec.nbytes, tensor.dtype, tensor.shape).copy_(tensor.detach())
    return out[:total]


def unpack(flat: torch.Tensor, specs: Sequence[tensor_pb2.TensorSpec]) -> list[NamedTensor]:
    """Views (no copy) of each tensor of a received flat buffer, in spec order."""
    offsets, total = layout(specs)
    if flat.numel() < total:
        raise InvalidArgument(f"bucket buffer holds {flat.numel()} bytes but its specs need {total}")
    out: list[NamedTensor] = []
    for spec, offset in zip(specs, offsets, strict=True):
        dtype = dtypes.from_proto(spec.dtype, f"tensor {spec.name!r}")
        out.append((spec.name, _view(flat, offset, spec.nbytes, dtype, tuple(spec.shape))))
    return out


def _view(flat: torch.Tensor, offset: int, nbytes: int, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
    region = flat[offset : offset + nbytes]
    if dtype != torch.uint8:
        region = region.view(dtype)
    return region.view(tuple(shape))
