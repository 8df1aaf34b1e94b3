"""The manifest of a published weight version (manifest.json) and its strict parser.

Written last by `disk.write_version`, read first by `disk.read_version`: the version, every
file with its size, every tensor with its dtype, shape, file, byte range and digest (the
algorithm the manifest names, see hashing.py), and the extra files (config.json...) with their sha256. Its own sha256 is what DiskWeights.manifest_sha256
carries, so a replica can refuse a folder that is not the one the trainer published.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch

from meshrl.common.errors import InvalidArgument

from . import dtypes
from .hashing import SHA256, check_digest, is_hex_digest
from .safetensors_io import FileEntry

MANIFEST_NAME = "manifest.json"
FORMAT = "meshrl-weights/1"


@dataclass(frozen=True)
class ExtraFile:
    name: str
    nbytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """version: the weight version; files: safetensors file name -> size in bytes;
    tensors: file name -> its entries in file order; total_bytes: sum of tensor bytes.
    In JSON each tensor's digest sits under the algorithm's name ("sha256": ..., "xxh3_128": ...),
    and a top-level "digest" names it; a manifest without one (written before the choice) is sha256."""

    version: int
    files: dict[str, int]
    tensors: dict[str, list[FileEntry]]
    extra_files: tuple[ExtraFile, ...]
    total_bytes: int
    digest: str = SHA256  # the algorithm of every FileEntry.digest (extra files: always sha256)

    @property
    def num_tensors(self) -> int:
        return sum(len(v) for v in self.tensors.values())

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": self.version,
            "total_bytes": self.total_bytes,
            "num_tensors": self.num_tensors,
            "digest": self.digest,
            "files": [{"file": name, "bytes": n} for name, n in self.files.items()],
            "tensors": [
                {
                    "name": e.name,
                    "dtype": dtypes.dtype_name(e.dtype),
                    "shape": list(e.shape),
                    "file": file,
                    "data_offsets": [e.begin, e.end],
                    self.digest: e.digest,
                }
                for file, entries in self.tensors.items()
                for e in entries
            ],
            "extra_files": [{"file": x.name, "bytes": x.nbytes, "sha256": x.sha256} for x in self.extra_files],
        }
        return _dump(doc).encode()

    @staticmethod
    def parse(raw: bytes, where: str) -> Manifest:
        """Parses and checks a manifest; raises InvalidArgument naming the bad field."""
        doc = load_doc(raw, where, FORMAT)
        version = _int(doc, "version", where)
        digest = check_digest(doc.get("digest", SHA256), f"{where}: manifest field 'digest'")
        files: dict[str, int] = {}
        for i, item in enumerate(_list(doc, "files", where)):
            name = _file_name(item, f"files[{i}]", where)
            if name in files:
                raise InvalidArgument(f"{where}: file {name!r} is listed twice in the manifest")
            files[name] = _int(item, "bytes", where, f"files[{i}].")
        tensors: dict[str, list[FileEntry]] = {name: [] for name in files}
        seen: set[str] = set()
        total = 0
        for i, item in enumerate(_list(doc, "tensors", where)):
            field = f"tensors[{i}]."
            name, dtype, shape = tensor_fields(item, field, where, seen)
            file = item.get("file")
            if file not in tensors:
                raise InvalidArgument(f"{where}: tensor {name!r} is in file {file!r}, which the manifest does not list")
            offsets = item.get("data_offsets")
            nbytes = dtypes.nbytes_of(shape, dtype)
            if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
                raise InvalidArgument(f"{where}: tensor {name!r} has bad data_offsets {offsets!r}")
            if offsets[0] < 0 or offsets[1] - offsets[0] != nbytes:
                raise InvalidArgument(f"{where}: tensor {name!r} data_offsets {offsets} do not hold {nbytes} bytes")
            hex_ = _digest(item, where, field, digest)
            tensors[file].append(FileEntry(name, dtype, tuple(shape), offsets[0], offsets[1], hex_))
            total += nbytes
        extras = []
        for i, item in enumerate(_list(doc, "extra_files", where)):
            field = f"extra_files[{i}]."
            extras.append(
                ExtraFile(_file_name(item, field, where), _int(item, "bytes", where, field), _sha(item, where, field))
            )
        if _int(doc, "total_bytes", where) != total:
            raise InvalidArgument(f"{where}: total_bytes {doc['total_bytes']} differs from the tensors' sum {total}")
        return Manifest(version, files, tensors, tuple(extras), total, digest)


def load_doc(raw: bytes, where: str, fmt: str) -> dict:
    """The JSON object of a manifest whose "format" is `fmt` (also used by delta_manifest.py)."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise InvalidArgument(f"{where}: manifest is not valid JSON ({e}); re-publish this version") from e
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise InvalidArgument(f"{where}: manifest format is {got!r}, expected {fmt!r}")
    return doc


def tensor_fields(item: object, field: str, where: str, seen: set[str]) -> tuple[str, torch.dtype, list[int]]:
    """The name (new to `seen`, which it joins), dtype and shape of one manifest tensor entry."""
    name = item.get("name") if isinstance(item, dict) else None
    if not isinstance(name, str) or not name or name in seen:
        raise InvalidArgument(f"{where}: {field}name {name!r} is missing, empty or repeated")
    seen.add(name)
    dtype = dtypes.from_name(str(item.get("dtype")), f"{where}: tensor {name!r}")
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InvalidArgument(f"{where}: tensor {name!r} has bad shape {shape!r}")
    return name, dtype, shape


def _dump(doc: dict) -> str:
    """JSON with one line per top-level field and per list item (readable, and diffs well)."""
    parts = []
    for key, value in doc.items():
        if isinstance(value, list) and value:
            items = ",\n".join("  " + json.dumps(item) for item in value)
            parts.append(f" {json.dumps(key)}: [\n{items}\n ]")
        else:
            parts.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def sha256_hex(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _list(doc: dict, key: str, where: str) -> list:
    value = doc.get(key)
    if not isinstance(value, list):
        raise InvalidArgument(f"{where}: manifest field {key!r} must be a list, got {type(value).__name__}")
    return value


def _int(doc: object, key: str, where: str, prefix: str = "") -> int:
    value = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"{where}: manifest field {prefix}{key} must be a non-negative integer, got {value!r}")
    return value


def _sha(item: dict, where: str, field: str) -> str:
    return _digest(item, where, field, SHA256)


def _digest(item: dict, where: str, field: str, algorithm: str) -> str:
    value = item.get(algorithm)
    if not is_hex_digest(value, algorithm):
        raise InvalidArgument(f"{where}: {field}{algorithm} {value!r} is not a lowercase {algorithm} hex digest")
    return value


def _file_name(item: object, field: str, where: str) -> str:
    name = item.get("file") if isinstance(item, dict) else None
    if (
        not isinstance(name, str)
        or not name
        or "/" in name
        or "\\" in name
        or name in (".", "..")
        or name == MANIFEST_NAME
    ):
        raise InvalidArgument(f"{where}: {field}file {name!r} must be a plain file name inside the version folder")
    return name
