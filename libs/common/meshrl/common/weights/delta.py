"""Delta weight versions on disk: after a complete version, publish only the bits that changed.

Trainer: `DeltaBase` keeps a copy of the version it published last; `write_delta(root, version,
base, export)` encodes every tensor against it (delta_codec.py), moves the base to the new
version, and writes `<root>/d000008/` (delta.bin + manifest.json, see delta_manifest.py)
atomically like a complete version — or writes nothing and returns None when the delta would
exceed `max_fraction` of a complete version (the caller then writes `base.tensors` in full).
Replica: `stage_delta` (while it still generates) checks the manifest, that it serves the base
version, each blob's sha256, and the sha256 of every resulting tensor against the manifest (the
digests a complete version carries); `apply_delta` (paused) only copies the changed tensors in.
A replica that does not hold the base gets BaseMismatch; a corrupt delta DataLoss; either way
its parameters are untouched.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import DataLoss, FailedPrecondition, InvalidArgument, NotFound

from . import dtypes
from .apply import MAX_LISTED, find_problems, missing_names, refuse
from .buckets import DEFAULT_BUCKET_BYTES, NamedTensor, as_buckets
from .delta_codec import apply, encode
from .delta_manifest import DATA_NAME, DeltaEntry, DeltaManifest
from .disk import delta_dir_name, gc_versions, publish_folder
from .errors import BaseMismatch
from .hashing import WORKERS
from .manifest import MANIFEST_NAME, sha256_hex

DEFAULT_MAX_FRACTION = 0.5


def _sha(tensor: torch.Tensor) -> str:
    return hashlib.sha256(memoryview(dtypes.as_bytes(tensor.detach().cpu()).numpy())).hexdigest()


class DeltaBase:
    """The trainer's CPU copy of the version it published last: the base of its next delta."""

    def __init__(self) -> None:
        self.version = -1
        self.tensors: dict[str, torch.Tensor] = {}

    def holds(self, version: int) -> bool:
        return self.version == version and bool(self.tensors)

    def drop(self) -> None:
        self.version, self.tensors = -1, {}

    def record(self, version: int, tensors: Iterable) -> Iterator[Sequence[NamedTensor]]:
        """Passes an export through (as buckets) while copying it as the new base; the base holds
        `version` once the export is exhausted, and nothing if it fails part way."""
        self.drop()
        kept: dict[str, torch.Tensor] = {}
        for bucket in as_buckets(tensors, DEFAULT_BUCKET_BYTES):
            for name, tensor in bucket:
                kept[name] = tensor.detach().to("cpu", copy=True)
            yield bucket
        self.version, self.tensors = version, kept


@dataclass(frozen=True)
class DeltaStats:
    changed: int  # elements
    elements: int
    delta_bytes: int
    full_bytes: int


def encode_delta(base: DeltaBase, version: int, tensors: Iterable) -> tuple[list[DeltaEntry], list[bytes], DeltaStats]:
    """Encodes an export against `base` and moves the base to it (`base.version` = version).
    Raises FailedPrecondition (base dropped) when the export's tensors differ from the base's."""
    if not base.tensors or version <= base.version:
        raise FailedPrecondition(f"no base older than version {version} is held; publish a complete version")
    entries: list[DeltaEntry] = []
    blobs: list[bytes] = []
    seen: set[str] = set()
    offset = changed = elements = 0

    def job(name: str, new: torch.Tensor) -> tuple[str, torch.Tensor, int, bytes, str]:
        old = base.tensors[name]
        enc = encode(old, new)
        digest = _sha(new)
        if enc.changed:
            old.copy_(new.detach())
        return name, new, enc.changed, enc.blob, digest

    try:
        with ThreadPoolExecutor(WORKERS, thread_name_prefix="weights-delta") as pool:
            for bucket in as_buckets(tensors, DEFAULT_BUCKET_BYTES):
                for name, new in bucket:
                    old = base.tensors.get(name)
                    if old is None or old.dtype != new.dtype or old.shape != new.shape or name in seen:
                        raise FailedPrecondition(
                            f"tensor {name!r} is not in the delta base as {new.dtype} {list(new.shape)} (or repeats); "
                            "publish a complete version"
                        )
                    seen.add(name)
                for name, new, n, blob, digest in pool.map(lambda p: job(*p), bucket):
                    entries.append(
                        DeltaEntry(
                            name,
                            new.dtype,
                            tuple(new.shape),
                            digest,
                            n,
                            offset,
                            offset + len(blob),
                            sha256_hex(blob) if n else "",
                        )
                    )
                    blobs.append(blob)
                    offset += len(blob)
                    changed += n
                    elements += new.numel()
        missing = sorted(set(base.tensors) - seen)
        if missing:
            raise FailedPrecondition(f"the export lacks {missing[:MAX_LISTED]} of the base; publish a complete version")
    except BaseException:
        base.drop()  # part of it moved to the new version: unusable
        raise
    base.version = version
    full = sum(e.nbytes for e in entries)
    return entries, blobs, DeltaStats(changed, elements, offset, full)


def encode_within(
    base: DeltaBase, version: int, tensors: Iterable, max_fraction: float
) -> tuple[DeltaManifest | None, list[bytes], DeltaStats]:
    """`encode_delta`, with the manifest of the delta; (None, [], stats) when the delta exceeds `max_fraction`
    of a complete version. Either way the base then holds `version`. Used for deltas on disk and over a group."""
    if not 0 < max_fraction <= 1:
        raise InvalidArgument(f"max_fraction must be in (0, 1], got {max_fraction}")
    base_version = base.version
    entries, blobs, stats = encode_delta(base, version, tensors)
    if stats.delta_bytes > max_fraction * stats.full_bytes:
        return None, [], stats
    return DeltaManifest(version, base_version, stats.delta_bytes, tuple(entries)), blobs, stats


def write_delta(
    root: str,
    version: int,
    base: DeltaBase,
    tensors: Iterable,
    keep_last: int = 0,
    *,
    max_fraction: float = DEFAULT_MAX_FRACTION,
    fsync: bool = True,
) -> tuple[weights_pb2.DiskWeights | None, DeltaStats]:
    """Publishes `version` as a delta against `base` (`<root>/d{version:06d}/`), or writes nothing and
    returns (None, stats) when it would exceed `max_fraction` of a complete version; either way the base
    then holds `version`. Raises FailedPrecondition when no usable base is held."""
    manifest, blobs, stats = encode_within(base, version, tensors, max_fraction)
    if manifest is None:
        return None, stats
    os.makedirs(root, exist_ok=True)

    def fill(tmp: str) -> bytes:
        with open(os.path.join(tmp, DATA_NAME), "wb") as f:
            for blob in blobs:
                f.write(blob)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        return manifest.to_json()

    raw = publish_folder(root, delta_dir_name(version), fill, fsync)
    gc_versions(root, keep_last)
    path = os.path.join(root, delta_dir_name(version))
    return weights_pb2.DiskWeights(
        path=path,
        version=version,
        manifest_sha256=sha256_hex(raw),
        delta=True,
        base_version=manifest.base_version,
        delta_bytes=stats.delta_bytes,
    ), stats


def read_delta_manifest(path: str, expected_manifest_sha256: str | None = None) -> tuple[DeltaManifest, str]:
    """Reads and checks `<path>/manifest.json` of a delta; NotFound, DataLoss (other sha256), InvalidArgument."""
    manifest_path = os.path.join(path, MANIFEST_NAME)
    try:
        with open(manifest_path, "rb") as f:
            raw = f.read()
    except FileNotFoundError as e:
        raise NotFound(f"delta weight folder {path} has no manifest.json (incomplete or absent)") from e
    sha = sha256_hex(raw)
    if expected_manifest_sha256 and sha != expected_manifest_sha256:
        raise DataLoss(f"{manifest_path} has sha256 {sha}, but {expected_manifest_sha256} was published")
    return DeltaManifest.parse(raw, manifest_path), sha


@dataclass
class StagedDelta:
    """A verified delta, decoded into the new values of the changed tensors (CPU), not yet applied."""

    version: int
    base_version: int
    tensors: list[NamedTensor]
    delta_bytes: int


def stage_delta(
    named_params: Mapping[str, torch.Tensor],
    weights: weights_pb2.DiskWeights,
    current_version: int,
    verify: bool = True,
) -> StagedDelta:
    """Checks a delta against the live parameters and decodes it without touching them.

    Raises BaseMismatch when this replica does not serve the delta's base version, or when a tensor
    it produces differs from the manifest's sha256 (its weights are not the base's); DataLoss for a
    corrupt or truncated data file; InvalidArgument for a malformed manifest, another version than
    announced, or tensors that are not the model's. `verify` also hashes the unchanged tensors.
    """
    manifest, _ = read_delta_manifest(weights.path, weights.manifest_sha256 or None)
    where = weights.path
    if weights.version and manifest.version != weights.version:
        raise InvalidArgument(f"{where} holds version {manifest.version}, but {weights.version} was announced")
    check_delta(named_params, manifest, current_version)
    data_path = os.path.join(where, DATA_NAME)
    try:
        size = os.path.getsize(data_path)
        fd = os.open(data_path, os.O_RDONLY)
    except OSError as e:
        raise DataLoss(f"{data_path}: delta data file is missing ({e})") from e
    try:
        if size != manifest.data_bytes:
            raise DataLoss(f"{data_path} has {size} bytes, the manifest says {manifest.data_bytes}: truncated")
        return decode_delta(named_params, manifest, lambda e: os.pread(fd, e.end - e.begin, e.begin), where, verify)
    finally:
        os.close(fd)


def check_delta(named_params: Mapping[str, torch.Tensor], manifest: DeltaManifest, current_version: int) -> None:
    """BaseMismatch when this replica does not serve the delta's base version; InvalidArgument when the
    manifest's tensors are not the model's. Touches nothing."""
    if current_version != manifest.base_version:
        raise BaseMismatch(
            f"weight version {manifest.version} is a delta against version {manifest.base_version}, but this "
            f"replica serves {current_version}; refit it with a complete version"
        )
    problems, seen = find_problems(named_params, ((e.name, e.dtype, e.shape) for e in manifest.tensors))
    missing = missing_names(named_params, seen)
    if missing:
        problems.append(f"{len(missing)} parameter(s) missing from the delta, e.g. {missing[:MAX_LISTED]}")
    if problems:
        raise refuse(manifest.version, problems)


def decode_delta(
    named_params: Mapping[str, torch.Tensor],
    manifest: DeltaManifest,
    blob_of: Callable[[DeltaEntry], bytes | memoryview],
    where: str,
    verify: bool = True,
) -> StagedDelta:
    """Decodes a checked delta (`check_delta`) against the live parameters without touching them:
    `blob_of(entry)` gives each changed tensor's blob. DataLoss for a blob that differs from its sha256;
    BaseMismatch when a resulting tensor differs from the manifest's sha256 (the weights are not the
    base's); `verify` also hashes the unchanged tensors. Used for deltas on disk and over a weight group."""

    def job(e: DeltaEntry) -> NamedTensor | None:
        param = named_params[e.name]
        if not e.changed:
            if verify and _sha(param) != e.sha256:
                raise BaseMismatch(f"{where}: this replica's {e.name!r} is not version {manifest.base_version}'s")
            return None
        blob = blob_of(e)
        if sha256_hex(blob) != e.blob_sha256:
            raise DataLoss(f"{where}: the blob of {e.name!r} does not match its sha256; the delta is corrupt")
        new = apply(blob, param, e.changed, f"{where}: {e.name!r}")
        if _sha(new) != e.sha256:
            raise BaseMismatch(
                f"{where}: applying the delta to this replica's {e.name!r} does not give version "
                f"{manifest.version}'s tensor: its weights are not version {manifest.base_version}'s; refit it"
            )
        return e.name, new

    with ThreadPoolExecutor(WORKERS, thread_name_prefix="weights-delta") as pool:
        staged = [t for t in pool.map(job, manifest.tensors) if t is not None]
    return StagedDelta(manifest.version, manifest.base_version, staged, manifest.data_bytes)


def apply_delta(named_params: Mapping[str, torch.Tensor], staged: StagedDelta) -> int:
    """Copies a staged delta's changed tensors into the parameters in place; returns the bytes copied."""
    with torch.no_grad():
        for name, tensor in staged.tensors:
            named_params[name].copy_(tensor)
    return sum(t.numel() * t.element_size() for _, t in staged.tensors)
