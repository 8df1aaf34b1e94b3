"""The manifest of a delta weight version (d000008/manifest.json) and its strict parser.

Written last by `delta.write_delta`, read first by `delta.stage_delta`. It names the version,
its base version, the encoding (delta_codec.py), the data file's size, and per tensor: dtype,
shape, the sha256 of its new bytes (the digest a complete version's manifest carries for the
same tensor), how many elements changed, and the byte range and sha256 of its blob in the data
file. Every tensor of the model is listed, unchanged ones with changed = 0 and no blob.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from meshrl.common.errors import InvalidArgument

from . import dtypes
from .delta_codec import ENCODING
from .hashing import SHA256, is_hex_digest
from .manifest import _dump, _int, _list, _sha, load_doc, tensor_fields

FORMAT = "meshrl-weights-delta/1"
DATA_NAME = "delta.bin"


@dataclass(frozen=True)
class DeltaEntry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    sha256: str  # of the tensor's new bytes
    changed: int
    begin: int  # blob's byte range in the data file (begin == end: unchanged)
    end: int
    blob_sha256: str  # "" when unchanged

    @property
    def nbytes(self) -> int:
        return dtypes.nbytes_of(self.shape, self.dtype)


@dataclass(frozen=True)
class DeltaManifest:
    version: int
    base_version: int
    data_bytes: int
    tensors: tuple[DeltaEntry, ...]

    @property
    def total_bytes(self) -> int:
        """Bytes of the complete version this delta produces."""
        return sum(e.nbytes for e in self.tensors)

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": self.version,
            "base_version": self.base_version,
            "encoding": ENCODING,
            "data_file": DATA_NAME,
            "data_bytes": self.data_bytes,
            "total_bytes": self.total_bytes,
            "tensors": [
                {
                    "name": e.name,
                    "dtype": dtypes.dtype_name(e.dtype),
                    "shape": list(e.shape),
                    "sha256": e.sha256,
                    "changed": e.changed,
                    "data_offsets": [e.begin, e.end],
                    "blob_sha256": e.blob_sha256,
                }
                for e in self.tensors
            ],
        }
        return _dump(doc).encode()

    @staticmethod
    def parse(raw: bytes, where: str) -> DeltaManifest:
        """Parses and checks a delta manifest; raises InvalidArgument naming the bad field."""
        doc = load_doc(raw, where, FORMAT)
        if doc.get("encoding") != ENCODING:
            raise InvalidArgument(f"{where}: delta encoding {doc.get('encoding')!r} is not {ENCODING!r}")
        version, base = _int(doc, "version", where), _int(doc, "base_version", where)
        if base >= version:
            raise InvalidArgument(f"{where}: base_version {base} must be older than version {version}")
        data_bytes = _int(doc, "data_bytes", where)
        entries, seen, covered = [], set(), 0
        for i, item in enumerate(_list(doc, "tensors", where)):
            field = f"tensors[{i}]."
            name, dtype, shape = tensor_fields(item, field, where, seen)
            changed = _int(item, "changed", where, field)
            offsets = item.get("data_offsets")
            if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
                raise InvalidArgument(f"{where}: tensor {name!r} has bad data_offsets {offsets!r}")
            begin, end = offsets
            numel = dtypes.nbytes_of(shape, dtype) // max(dtype.itemsize, 1)
            blob_sha = item.get("blob_sha256")
            if changed > numel or not 0 <= begin <= end <= data_bytes or (changed == 0) != (begin == end):
                raise InvalidArgument(
                    f"{where}: tensor {name!r}: changed {changed} of {numel} elements with blob {offsets} "
                    f"in a {data_bytes}-byte data file is inconsistent"
                )
            if changed and not is_hex_digest(blob_sha, SHA256):
                raise InvalidArgument(f"{where}: {field}blob_sha256 {blob_sha!r} is not a sha256 hex digest")
            covered += end - begin
            entries.append(
                DeltaEntry(name, dtype, tuple(shape), _sha(item, where, field), changed, begin, end, blob_sha or "")
            )
        if covered != data_bytes:
            raise InvalidArgument(f"{where}: the tensors' blobs cover {covered} bytes, data_bytes says {data_bytes}")
        return DeltaManifest(version, base, data_bytes, tuple(entries))
