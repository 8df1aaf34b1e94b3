"""Writing and verified reading of one Hugging Face safetensors file, with per-tensor sha256.

Used by `disk.py` (one file per bucket). Files are standard safetensors (any HF loader reads
them): an 8-byte little-endian header length, a JSON header, then the tensors back to back.
Tensors are written largest itemsize first so every tensor is naturally aligned, straight from
the tensor's memory (no serialised copy), and hashed on a worker thread while they are written.
Reading fills one buffer per file and hashes each chunk while the next one is read; the
tensors handed back are views of that buffer.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import struct
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
from meshrl.common.errors import DataLoss

from . import dtypes

HEADER_ALIGN = 64  # data section starts at a multiple of this many bytes
READ_CHUNK = 64 * 1024**2
MAX_HEADER = 100 * 1024**2


@dataclass(frozen=True)
class FileEntry:
    """One tensor in a safetensors file: offsets are relative to the start of the data section."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int
    sha256: str


def _cpu_bytes(tensor: torch.Tensor) -> memoryview:
    if tensor.device.type != "cpu":
        tensor = tensor.detach().to("cpu")
    return memoryview(dtypes.as_bytes(tensor).numpy())


def _sha256(view: memoryview) -> str:
    return hashlib.sha256(view).hexdigest()


def write_file(
    path: str, named_tensors: Sequence[tuple[str, torch.Tensor]], fsync: bool = True
) -> tuple[list[FileEntry], int]:
    """Writes one safetensors file; returns its entries (in file order) and the file's size in bytes."""
    order = sorted(range(len(named_tensors)), key=lambda i: -named_tensors[i][1].element_size())
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    placed: list[tuple[str, torch.Tensor, int, int]] = []
    offset = 0
    for i in order:
        name, tensor = named_tensors[i]
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": dtypes.safetensors_code(tensor.dtype, f"tensor {name!r}"),
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        placed.append((name, tensor, offset, offset + nbytes))
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % HEADER_ALIGN)
    hashes: list[Future[str]] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-hash") as pool, open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, tensor, _, _ in placed:
            view = _cpu_bytes(tensor)
            hashes.append(pool.submit(_sha256, view))
            f.write(view)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
        digests = [h.result() for h in hashes]
    entries = [
        FileEntry(name, tensor.dtype, tuple(tensor.shape), begin, end, digest)
        for (name, tensor, begin, end), digest in zip(placed, digests, strict=True)
    ]
    return entries, 8 + len(raw) + offset


def read_header(path: str, f) -> tuple[int, dict]:
    """Parses the header of an open safetensors file; returns (data start, header dict)."""
    head = f.read(8)
    if len(head) != 8:
        raise DataLoss(f"{path}: truncated safetensors file (no header length); re-publish this version")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER:
        raise DataLoss(f"{path}: header length {n} is implausible; the file is corrupt, re-publish this version")
    raw = f.read(n)
    if len(raw) != n:
        raise DataLoss(f"{path}: truncated safetensors header; re-publish this version")
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise DataLoss(f"{path}: safetensors header is not JSON ({e}); the file is corrupt") from e
    if not isinstance(header, dict):
        raise DataLoss(f"{path}: safetensors header is not a JSON object; the file is corrupt")
    return 8 + n, header


def read_file(
    path: str, entries: Sequence[FileEntry], file_bytes: int, verify: bool = True
) -> list[tuple[str, torch.Tensor]]:
    """Reads a file the manifest describes, checks its header against `entries` and (if verify)
    every tensor's sha256. Returns (name, tensor) views of one CPU buffer, in `entries` order.

    Raises DataLoss for a missing, truncated, or altered file.
    """
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise DataLoss(f"{path}: weight file is missing ({e}); the version folder is incomplete") from e
    if size != file_bytes:
        raise DataLoss(f"{path}: file has {size} bytes, the manifest says {file_bytes}: truncated or altered")
    with open(path, "rb") as f:
        start, header = read_header(path, f)
        _check_header(path, header, entries, size - start)
        buffer = torch.empty(size - start, dtype=torch.uint8)
        view = memoryview(buffer.numpy())
        hashers = {e.name: hashlib.sha256() for e in entries} if verify else {}
        by_begin = sorted(entries, key=lambda e: e.begin)
        jobs: list[Future[None]] = []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-hash") as pool:
            done = 0
            while done < len(view):
                got = f.readinto(view[done : done + READ_CHUNK])
                if not got:
                    raise DataLoss(f"{path}: file ended at byte {start + done} of {size} while reading")
                if verify:
                    jobs.append(pool.submit(_hash_range, view, by_begin, hashers, done, done + got))
                done += got
            for job in jobs:
                job.result()
    for e in entries:
        if verify and hashers[e.name].hexdigest() != e.sha256:
            raise DataLoss(f"{path}: tensor {e.name!r} does not match its sha256 in the manifest; the file is corrupt")
    return [(e.name, _tensor(buffer, e)) for e in entries]


def _hash_range(view: memoryview, entries: Sequence[FileEntry], hashers: dict, lo: int, hi: int) -> None:
    """Feeds bytes [lo, hi) of the data section to the hashers of the tensors they belong to."""
    first = bisect.bisect_right([e.end for e in entries], lo)
    for e in entries[first:]:
        if e.begin >= hi:
            break
        hashers[e.name].update(view[max(e.begin, lo) : min(e.end, hi)])


def _tensor(buffer: torch.Tensor, e: FileEntry) -> torch.Tensor:
    region = buffer[e.begin : e.end]
    if e.dtype != torch.uint8:
        if e.begin % e.dtype.itemsize:  # a file written by another tool may leave a tensor unaligned
            region = region.clone()
        region = region.view(e.dtype)
    return region.view(e.shape)


def _check_header(path: str, header: dict, entries: Sequence[FileEntry], data_len: int) -> None:
    names = {k for k in header if k != "__metadata__"}
    expected = {e.name for e in entries}
    if names != expected:
        extra, missing = sorted(names - expected), sorted(expected - names)
        raise DataLoss(f"{path}: header tensors differ from the manifest (extra {extra[:5]}, missing {missing[:5]})")
    for e in entries:
        h = header[e.name]
        ok = (
            isinstance(h, dict)
            and h.get("dtype") == dtypes.safetensors_code(e.dtype)
            and list(h.get("shape", ())) == list(e.shape)
            and list(h.get("data_offsets", ())) == [e.begin, e.end]
        )
        if not ok:
            raise DataLoss(f"{path}: header entry of {e.name!r} ({h}) differs from the manifest; the file is corrupt")
    covered = sum(e.end - e.begin for e in entries)
    if covered != data_len:
        raise DataLoss(f"{path}: data section has {data_len} bytes but its tensors cover {covered}")
