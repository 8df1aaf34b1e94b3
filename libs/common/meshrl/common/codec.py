"""Tensor codec between numpy/torch and meshrl's wire types (TensorSpec + raw bytes).

Every service and client uses it to put tensors on the wire: raw little-endian
C-contiguous bytes with dtype and shape, ragged sequences as values + offsets; no pickle.
Encoding hands out memoryviews of the arrays' own buffers (no copy); decoding builds
arrays over the received buffer (no copy beyond joining the frames).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from meshrl.api.common.v1 import tensor_pb2 as pb
from meshrl.common.errors import InvalidArgument

NUMPY_BY_DTYPE: dict[int, np.dtype] = {
    pb.DTYPE_FLOAT32: np.dtype(np.float32),
    pb.DTYPE_FLOAT16: np.dtype(np.float16),
    pb.DTYPE_BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    pb.DTYPE_FLOAT64: np.dtype(np.float64),
    pb.DTYPE_INT8: np.dtype(np.int8),
    pb.DTYPE_UINT8: np.dtype(np.uint8),
    pb.DTYPE_INT16: np.dtype(np.int16),
    pb.DTYPE_INT32: np.dtype(np.int32),
    pb.DTYPE_INT64: np.dtype(np.int64),
    pb.DTYPE_BOOL: np.dtype(np.bool_),
}
DTYPE_BY_NUMPY: dict[np.dtype, int] = {v: k for k, v in NUMPY_BY_DTYPE.items()}
SUPPORTED = ", ".join(sorted(str(d) for d in DTYPE_BY_NUMPY))

if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
    raise ImportError("meshrl's tensor codec assumes a little-endian host")


@dataclass
class Ragged:
    """A list of variable-length rows: `values` [total, ...] and `offsets` int64 [n + 1]."""

    values: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_rows(cls, rows: Sequence[Any], dtype: Any = None) -> Ragged:
        arrays = [np.asarray(r, dtype=dtype) for r in rows]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        if arrays:
            values = np.concatenate(arrays) if offsets[-1] else np.zeros((0, *arrays[0].shape[1:]), arrays[0].dtype)
        else:
            values = np.zeros(0, dtype=dtype or np.float32)
        return cls(values, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def rows(self) -> list[np.ndarray]:
        return [self.row(i) for i in range(len(self))]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def take(self, indices: Sequence[int]) -> Ragged:
        return Ragged.from_rows([self.row(i) for i in indices], dtype=self.values.dtype)


Column = np.ndarray | Ragged


@dataclass
class Batch:
    """Named columns (one row per sample) with per-row SampleMeta and free-form attributes."""

    columns: dict[str, Column] = field(default_factory=dict)
    samples: list[pb.SampleMeta] = field(default_factory=list)
    attrs: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Column:
        try:
            return self.columns[name]
        except KeyError:
            raise InvalidArgument(
                f"batch has no column '{name}' (it has: {', '.join(sorted(self.columns)) or 'none'}); "
                "check that the node producing it is upstream of this one"
            ) from None

    def num_rows(self) -> int:
        for col in self.columns.values():
            return len(col)
        return len(self.samples)

    def take(self, indices: Sequence[int]) -> Batch:
        idx = list(indices)
        cols = {k: v.take(idx) if isinstance(v, Ragged) else v[idx] for k, v in self.columns.items()}
        samples = [self.samples[i] for i in idx] if self.samples else []
        return Batch(cols, samples, dict(self.attrs))


def merge_batches(batches: Iterable[Batch]) -> Batch:
    """Merges batches with the same rows by column; a column may come from one batch only."""
    merged = Batch()
    for b in batches:
        for name, col in b.columns.items():
            if name in merged.columns:
                raise InvalidArgument(f"column '{name}' is written by two upstream nodes; rename one of them")
            merged.columns[name] = col
        merged.samples = merged.samples or list(b.samples)
        merged.attrs.update(b.attrs)
    rows = {len(c) for c in merged.columns.values()}
    if len(rows) > 1:
        raise InvalidArgument(f"upstream batches disagree on the number of rows: {sorted(rows)}")
    return merged


def _as_numpy(value: Any, name: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    module = type(value).__module__
    if module.startswith("torch"):
        import torch  # only when the caller already uses torch

        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.contiguous().numpy()
    if isinstance(value, (list, tuple, int, float, bool)):
        return np.asarray(value)
    raise InvalidArgument(
        f"tensor '{name}': cannot encode a {type(value).__name__}; pass a numpy array or torch tensor"
    )


def _spec(name: str, array: np.ndarray) -> pb.TensorSpec:
    dtype = DTYPE_BY_NUMPY.get(array.dtype)
    if dtype is None:
        raise InvalidArgument(f"tensor '{name}': dtype {array.dtype} is not supported; use one of: {SUPPORTED}")
    return pb.TensorSpec(name=name, dtype=dtype, shape=array.shape, nbytes=array.nbytes)


def encode_column(name: str, value: Any) -> tuple[pb.TensorSpec, memoryview]:
    """Returns the spec and a zero-copy view of the column's bytes (copied only if not contiguous)."""
    if isinstance(value, Ragged):
        values = np.ascontiguousarray(_as_numpy(value.values, name))
        spec = _spec(name, values)
        spec.ragged = True
        spec.offsets.extend(np.asarray(value.offsets, dtype=np.int64).tolist())
    else:
        values = np.ascontiguousarray(_as_numpy(value, name))
        spec = _spec(name, values)
    validate_spec(spec)
    return spec, memoryview(values.reshape(-1).view(np.uint8))


def validate_spec(spec: pb.TensorSpec, field_prefix: str = "tensors") -> np.dtype:
    """Checks a spec on its own (dtype, shape, byte length, offsets); returns its numpy dtype."""
    where = f"{field_prefix}['{spec.name}']"
    if not spec.name:
        raise InvalidArgument(f"{field_prefix}: a tensor has an empty name; give every tensor a unique name")
    dtype = NUMPY_BY_DTYPE.get(spec.dtype)
    if dtype is None:
        raise InvalidArgument(f"{where}.dtype = {spec.dtype} is not a supported dtype; use one of: {SUPPORTED}")
    if any(d < 0 for d in spec.shape):
        raise InvalidArgument(f"{where}.shape = {list(spec.shape)} has a negative dimension")
    expected = math.prod(spec.shape) * dtype.itemsize
    if spec.nbytes != expected:
        raise InvalidArgument(
            f"{where}.nbytes = {spec.nbytes} but shape {list(spec.shape)} x {dtype} itemsize {dtype.itemsize} "
            f"needs {expected} bytes"
        )
    if spec.ragged:
        offs = list(spec.offsets)
        first = spec.shape[0] if spec.shape else 0
        if not offs or offs[0] != 0 or offs[-1] != first or any(b < a for a, b in zip(offs, offs[1:])):
            raise InvalidArgument(
                f"{where}.offsets must start at 0, never decrease and end at shape[0] = {first}; got {offs[:8]}"
                + ("..." if len(offs) > 8 else "")
            )
    elif spec.offsets:
        raise InvalidArgument(f"{where}.offsets given for a tensor that is not ragged; set ragged=true or drop them")
    return dtype


def validate_header(header: pb.BatchHeader) -> None:
    """Checks every spec, unique names, equal row counts and total_bytes."""
    names = set()
    total = 0
    rows = set()
    for spec in header.tensors:
        validate_spec(spec)
        if spec.name in names:
            raise InvalidArgument(f"tensors['{spec.name}'] appears twice in the batch; names must be unique")
        names.add(spec.name)
        total += spec.nbytes
        rows.add(len(spec.offsets) - 1 if spec.ragged else (spec.shape[0] if spec.shape else 1))
    if header.total_bytes != total:
        raise InvalidArgument(f"total_bytes = {header.total_bytes} but the tensors add up to {total} bytes")
    if len(rows) > 1:
        raise InvalidArgument(f"tensors of one batch must have the same number of rows; got {sorted(rows)}")
    if header.samples and rows and len(header.samples) not in rows:
        raise InvalidArgument(f"samples has {len(header.samples)} entries but the tensors have {rows.pop()} rows")


def encode_batch(
    columns: Mapping[str, Any], samples: Sequence[pb.SampleMeta] = (), attrs: Mapping[str, str] | None = None
) -> tuple[pb.BatchHeader, list[memoryview]]:
    """Encodes columns into a header and the payload as a list of zero-copy views (header order)."""
    header = pb.BatchHeader(samples=list(samples), attrs=dict(attrs or {}))
    views = []
    for name, value in columns.items():
        spec, view = encode_column(name, value)
        header.tensors.append(spec)
        views.append(view)
    header.total_bytes = sum(v.nbytes for v in views)
    validate_header(header)
    return header, views


def decode_batch(header: pb.BatchHeader, payload: bytes | bytearray | memoryview) -> Batch:
    """Builds a Batch whose arrays view `payload` (no copy). Validates the header first."""
    validate_header(header)
    buf = memoryview(payload)
    if buf.nbytes != header.total_bytes:
        raise InvalidArgument(f"payload has {buf.nbytes} bytes but the header announces {header.total_bytes}")
    columns: dict[str, Column] = {}
    pos = 0
    for spec in header.tensors:
        dtype = NUMPY_BY_DTYPE[spec.dtype]
        arr = np.frombuffer(buf[pos : pos + spec.nbytes], dtype=dtype).reshape(tuple(spec.shape))
        pos += spec.nbytes
        columns[spec.name] = Ragged(arr, np.asarray(spec.offsets, dtype=np.int64)) if spec.ragged else arr
    return Batch(columns, list(header.samples), dict(header.attrs))


def batch_to_proto(batch: Batch) -> pb.TensorBatch:
    """A whole batch inline, for small batches (stream samples, control replies)."""
    header, views = encode_batch(batch.columns, batch.samples, batch.attrs)
    tensors = [pb.Tensor(spec=s, data=bytes(v)) for s, v in zip(header.tensors, views)]
    return pb.TensorBatch(tensors=tensors, samples=header.samples, attrs=header.attrs)


def batch_from_proto(message: pb.TensorBatch) -> Batch:
    header = pb.BatchHeader(
        tensors=[t.spec for t in message.tensors],
        samples=message.samples,
        attrs=message.attrs,
        total_bytes=sum(len(t.data) for t in message.tensors),
    )
    for t in message.tensors:
        if len(t.data) != t.spec.nbytes:
            raise InvalidArgument(f"tensors['{t.spec.name}'] carries {len(t.data)} bytes but nbytes = {t.spec.nbytes}")
    return decode_batch(header, b"".join(t.data for t in message.tensors))


def to_torch(array: np.ndarray):
    """A torch view of a decoded array (bfloat16 included); copies only read-only buffers."""
    import torch

    if not array.flags.writeable:
        array = array.copy()
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def concat_batches(batches: Sequence[Batch]) -> Batch:
    """Concatenates batches row-wise (the shards of one node's output, in shard order)."""
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return Batch()
    names = list(batches[0].columns)
    for b in batches[1:]:
        if list(b.columns) != names:
            raise InvalidArgument(f"shards disagree on columns: {names} vs {list(b.columns)}")
    columns: dict[str, Column] = {}
    for name in names:
        parts = [b.columns[name] for b in batches]
        if isinstance(parts[0], Ragged):
            starts = np.cumsum([0] + [p.offsets[-1] for p in parts[:-1]])
            offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, starts)]).astype(np.int64)
            columns[name] = Ragged(np.concatenate([p.values for p in parts]), offsets)
        else:
            columns[name] = np.concatenate(parts)
    samples = [s for b in batches for s in b.samples]
    attrs: dict[str, str] = {}
    for b in batches:
        attrs.update(b.attrs)
    return Batch(columns, samples, attrs)
