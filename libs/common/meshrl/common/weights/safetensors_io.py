"""Writing and verified reading of one Hugging Face safetensors file, with a digest per tensor.

Used by `disk.py` (one file per bucket). Files are standard safetensors (any HF loader reads
them): an 8-byte little-endian header length, a JSON header, then the tensors back to back.
Tensors are written largest itemsize first so every tensor is naturally aligned, straight from
the tensor's memory (no serialised copy), and hashed on worker threads while they are written.
`read_file` hands back views of one new buffer per file, hashing each chunk while the next one
is read; `verify_file` + `copy_file_into` check a file and then copy it into existing
parameters, both straight from a mapping of the file (the page cache: no read copy, and the
second pass finds the bytes the first one brought in). Versions are only ever replaced by rename
and removed by unlink, which a mapping survives; a file truncated in place while mapped would
fault the reader (SIGBUS), so nothing may rewrite a published file in place.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import torch

from meshrl.common.errors import DataLoss

from . import dtypes
from .hashing import SHA256, WORKERS, TensorHashers, digest_many

HEADER_ALIGN = 64  # data section starts at a multiple of this many bytes
READ_CHUNK = 16 * 1024**2
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: fault the whole mapping in at once
MAX_HEADER = 100 * 1024**2


@dataclass(frozen=True)
class FileEntry:
    """One tensor in a safetensors file: offsets are relative to the start of the data section."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int
    digest: str  # hex, of the algorithm the manifest names


def _cpu_bytes(tensor: torch.Tensor) -> memoryview:
    if tensor.device.type != "cpu":
        tensor = tensor.detach().to("cpu")
    return memoryview(dtypes.as_bytes(tensor).numpy())


def write_file(
    path: str, named_tensors: Sequence[tuple[str, torch.Tensor]], fsync: bool = True, digest: str = SHA256
) -> tuple[list[FileEntry], int]:
    """Writes one safetensors file; returns its entries (in file order, each with its `digest`
    hex) and the file's size in bytes."""
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
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="weights-hash") as pool, open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, tensor, _, _ in placed:  # each tensor is hashed on a worker while it is written
            view = _cpu_bytes(tensor)
            hashes.extend(digest_many([view], pool, digest))
            f.write(view)
        f.flush()
        if fsync:  # the disk write-back runs while the workers still hash
            os.fsync(f.fileno())
        digests = [h.result() for h in hashes]
    entries = [
        FileEntry(name, tensor.dtype, tuple(tensor.shape), begin, end, hex_)
        for (name, tensor, begin, end), hex_ in zip(placed, digests, strict=True)
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


def _open_checked(path: str, entries: Sequence[FileEntry], file_bytes: int) -> tuple[BinaryIO, int]:
    """Opens a weight file whose size and header match the manifest; returns it and its data start."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise DataLoss(f"{path}: weight file is missing ({e}); the version folder is incomplete") from e
    if size != file_bytes:
        raise DataLoss(f"{path}: file has {size} bytes, the manifest says {file_bytes}: truncated or altered")
    f = open(path, "rb")  # noqa: SIM115 - handed to the caller, which closes it
    try:
        start, header = read_header(path, f)
        _check_header(path, header, entries, size - start)
    except BaseException:
        f.close()
        raise
    return f, start


def read_file(
    path: str, entries: Sequence[FileEntry], file_bytes: int, verify: bool = True, digest: str = SHA256
) -> list[tuple[str, torch.Tensor]]:
    """Reads a file the manifest describes, checks its header against `entries` and (if verify)
    every tensor's `digest`. Returns (name, tensor) views of one new CPU buffer, in `entries` order.

    Raises DataLoss for a missing, truncated, or altered file.
    """
    f, start = _open_checked(path, entries, file_bytes)
    buffer = torch.empty(file_bytes - start, dtype=torch.uint8)
    view = memoryview(buffer.numpy())
    with f, TensorHashers(entries, digest) as hashers:
        done = 0
        while done < len(view):
            got = f.readinto(view[done : done + READ_CHUNK])
            if not got:
                raise DataLoss(f"{path}: file ended at byte {start + done} while reading")
            if verify:
                hashers.feed(view, done, done + got)  # hashed on workers while the next chunk is read
            done += got
        digests = hashers.digests()
    if verify:
        _compare(path, entries, digests, digest)
    return [(e.name, _tensor(buffer, e)) for e in entries]


@contextmanager
def _mapped(path: str, entries: Sequence[FileEntry], file_bytes: int) -> Iterator[tuple[mmap.mmap, int]]:
    """A checked file mapped whole, read-only (a private writable mapping would be populated by
    copying every page), with its data start. Views of it must be dropped before the block ends."""
    f, start = _open_checked(path, entries, file_bytes)
    with f:
        mapping = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    try:
        yield mapping, start
    finally:
        try:
            mapping.close()
        except BufferError:  # a view escaped through an exception; the mapping goes with it
            pass


def verify_file(path: str, entries: Sequence[FileEntry], file_bytes: int, digest: str = SHA256) -> None:
    """Checks a file's size, header and every tensor's `digest` without keeping its data: each
    tensor is hashed on a worker straight from the file's mapping."""
    with _mapped(path, entries, file_bytes) as (mapping, start), TensorHashers(entries, digest) as hashers:
        with memoryview(mapping) as view:
            hashers.feed(view[start:], 0, file_bytes - start)
            digests = hashers.digests()
    _compare(path, entries, digests, digest)


def copy_file_into(path: str, entries: Sequence[FileEntry], file_bytes: int, targets: dict[str, torch.Tensor]) -> None:
    """Copies each tensor of a (verified) file from its mapping straight into its target's memory
    (a contiguous CPU target; any other goes through a temporary CPU tensor and `copy_`)."""
    with _mapped(path, entries, file_bytes) as (mapping, start), torch.no_grad():
        for e in entries:
            if e.end == e.begin:
                continue
            source = np.frombuffer(mapping, dtype=np.uint8, count=e.end - e.begin, offset=start + e.begin)
            target = targets[e.name].detach()  # raw bytes in place: no autograd involved
            if target.is_contiguous() and target.device.type == "cpu":  # bytes to bytes, no alignment asked
                np.copyto(dtypes.as_bytes(target).numpy(), source)
            else:
                temp = torch.empty(e.shape, dtype=e.dtype)
                np.copyto(dtypes.as_bytes(temp).numpy(), source)
                target.copy_(temp)
            del source


def _compare(path: str, entries: Sequence[FileEntry], digests: dict[str, str], digest: str) -> None:
    for e in entries:
        if digests[e.name] != e.digest:
            raise DataLoss(
                f"{path}: tensor {e.name!r} does not match its {digest} in the manifest; the file is corrupt"
            )


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
