"""Disk transport: versioned safetensors folders written atomically, verified on read.

The trainer calls `write_version` after each update; a replica calls `stage_to_local` (optional,
while it still generates) and then `read_version` + `apply.apply_to_state` (or `load_version`).

Each bucket's file is written and hashed in one pass (safetensors_io.py), WRITERS buckets at once.
A version is not fsynced by default: it is derived state (the trainer re-publishes it from its
checkpoint after a crash, overwriting), the rename alone makes it appear whole to every reader
while the host is up, and a replica verifies every tensor's digest before it copies anything, so
a version torn by a host crash is refused (DataLoss), never served. Waiting for the disk cost
~2 s per GiB here, more than the rest of the publication. With fsync=True each file is fsynced
as soon as its bytes are written (while its hashes are still computed), then the manifest and
the folder, all before the rename.
Delta versions (`<root>/d000008/`) are written by delta.py through `publish_folder`.

Layout of `<root>/v000007/` (created as `<root>/.tmp-v000007-*`, fsynced if asked, then renamed):
    model.safetensors | model-0000i-of-0000n.safetensors   one file per bucket (HF shards)
    model.safetensors.index.json                           HF weight map (several shards only)
    <extra files>                                          e.g. config.json
    manifest.json                                          written last; see manifest.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import AlreadyExists, DataLoss, InvalidArgument, NotFound

from .buckets import DEFAULT_BUCKET_BYTES, NamedTensor, as_buckets
from .hashing import DEFAULT_DIGEST, check_digest
from .manifest import MANIFEST_NAME, ExtraFile, Manifest, sha256_hex
from .safetensors_io import copy_file_into, read_file, verify_file, write_file

INDEX_NAME = "model.safetensors.index.json"
_VERSION_DIR = re.compile(r"^v(\d{6,})$")
_DELTA_DIR = re.compile(r"^d(\d{6,})$")  # delta versions (delta.py)
_TMP_PREFIX = ".tmp-"
STALE_TMP_SECONDS = 3600.0
WRITERS = 2  # buckets written (and hashed) at once


def version_dir_name(version: int) -> str:
    return f"v{version:06d}"


def delta_dir_name(version: int) -> str:
    return f"d{version:06d}"


def list_versions(root: str, deltas: bool = False) -> list[tuple[int, str]]:
    """Complete versions under `root` (or, with `deltas`, delta versions), oldest first, as (version, path)."""
    if not os.path.isdir(root):
        return []
    found = []
    pattern = _DELTA_DIR if deltas else _VERSION_DIR
    for name in os.listdir(root):
        m = pattern.match(name)
        if m and os.path.isfile(os.path.join(root, name, MANIFEST_NAME)):
            found.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(found)


def gc_versions(root: str, keep_last: int) -> list[str]:
    """Deletes all but the newest `keep_last` versions and deltas (0 keeps all) and stale temp folders.

    Returns the removed paths. Keep at least 2 when replicas load in place, so a replica that
    is still reading the previous version does not lose it.
    """
    if keep_last < 0:
        raise InvalidArgument(f"keep_last must be >= 0 (0 keeps every version), got {keep_last}")
    removed = []
    if keep_last:
        for _, path in [*list_versions(root)[:-keep_last], *list_versions(root, deltas=True)[:-keep_last]]:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if os.path.isdir(root):
        now = time.time()
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if name.startswith(_TMP_PREFIX) and now - os.path.getmtime(path) > STALE_TMP_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def write_version(
    root: str,
    version: int,
    tensors: Iterable[NamedTensor] | Iterable[Sequence[NamedTensor]],
    keep_last: int = 0,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    extra_files: Mapping[str, bytes] | None = None,
    fsync: bool = False,
    overwrite: bool = False,
    digest: str = DEFAULT_DIGEST,
) -> weights_pb2.DiskWeights:
    """Publishes one complete weight version as `<root>/v{version:06d}/` and returns its DiskWeights.

    tensors: (HF name, tensor) pairs in export order (bucketed here by `bucket_bytes`), or
        ready-made buckets (sequences of pairs); any device, consumed lazily, one bucket at a time.
    keep_last: versions to keep after publishing (0 keeps all).
    extra_files: name -> bytes written beside the weights (config.json for engines that reload a
        model folder), checksummed in the manifest.
    fsync: make the files durable before the rename (a folder that must outlive a host crash
        as it is, e.g. a final model; see the module docstring for why updates need not).
    digest: the per-tensor integrity digest the manifest names ("xxh3_128", or "sha256" for
        replicas running a meshrl from before the choice).
    Raises InvalidArgument for a version older than the newest published one, a duplicate or
    unsupported tensor, or an empty export; AlreadyExists when the version exists (unless overwrite).
    """
    if version < 0:
        raise InvalidArgument(f"version must be >= 0, got {version}")
    check_digest(digest, "write_version")
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, version_dir_name(version))
    versions = list_versions(root)
    if versions and version < versions[-1][0]:
        raise InvalidArgument(
            f"version {version} is older than v{versions[-1][0]} already published in {root}; "
            "versions must not go back (continue the numbering after a resume, or clear the folder)"
        )
    if os.path.exists(final) and not overwrite:
        raise AlreadyExists(f"{final} already exists; publish a new version number or pass overwrite=True")
    raw = publish_folder(
        root,
        version_dir_name(version),
        lambda tmp: _write_folder(
            tmp, version, as_buckets(tensors, bucket_bytes), extra_files or {}, fsync, digest
        ).to_json(),
        fsync,
    )
    gc_versions(root, keep_last)
    return weights_pb2.DiskWeights(path=final, version=version, manifest_sha256=sha256_hex(raw))


def publish_folder(root: str, name: str, fill: Callable[[str], bytes], fsync: bool) -> bytes:
    """Creates `<root>/<name>/` atomically: `fill(tmp)` writes the files into a temporary folder and
    returns the manifest, written last; then one rename (an existing folder is swapped out). Returns
    the manifest's bytes. Also used by delta.py."""
    tmp = os.path.join(root, f"{_TMP_PREFIX}{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    final = os.path.join(root, name)
    os.mkdir(tmp)
    try:
        raw = fill(tmp)
        _write_bytes(os.path.join(tmp, MANIFEST_NAME), raw, fsync)
        if fsync:
            _fsync_dir(tmp)
        if os.path.exists(final):  # overwrite: move the old folder aside first, so the swap stays atomic-ish
            trash = f"{tmp}.old"
            os.rename(final, trash)
            os.rename(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, final)
        if fsync:
            _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return raw


def _write_folder(
    tmp: str,
    version: int,
    buckets: Iterator[Sequence[NamedTensor]],
    extra_files: Mapping[str, bytes],
    fsync: bool,
    digest: str,
) -> Manifest:
    parts: list[tuple[str, list, int]] = []
    seen: set[str] = set()
    pending: deque[tuple[str, Future]] = deque()
    with ThreadPoolExecutor(WRITERS, thread_name_prefix="weights-write") as pool:
        try:
            for i, bucket in enumerate(buckets):
                for name, _ in bucket:
                    if name in seen:
                        raise InvalidArgument(
                            f"tensor {name!r} appears twice in the export; every HF name must be unique"
                        )
                    seen.add(name)
                if len(pending) >= WRITERS:  # at most WRITERS buckets held at once
                    part, job = pending.popleft()
                    parts.append((part, *job.result()))
                part = os.path.join(tmp, f"part-{i:05d}.safetensors")
                pending.append((part, pool.submit(write_file, part, list(bucket), fsync, digest)))
            while pending:
                part, job = pending.popleft()
                parts.append((part, *job.result()))
        finally:
            for _, job in pending:
                job.cancel()
    n = len(parts)
    files: dict[str, int] = {}
    tensors: dict[str, list] = {}
    for i, (part, entries, size) in enumerate(parts):
        name = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        os.rename(part, os.path.join(tmp, name))
        files[name] = size
        tensors[name] = entries
    total = sum(e.end - e.begin for entries in tensors.values() for e in entries)
    extras = []
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": {e.name: f for f, es in tensors.items() for e in es}}
        extra_files = {INDEX_NAME: (json.dumps(index, indent=1) + "\n").encode(), **extra_files}
    for name, data in extra_files.items():
        if "/" in name or name in (MANIFEST_NAME, ".", "..") or name in files:
            raise InvalidArgument(f"extra file name {name!r} must be a plain file name not used by the weights")
        _write_bytes(os.path.join(tmp, name), data, fsync=False)
        extras.append(ExtraFile(name, len(data), sha256_hex(data)))
    if fsync:  # the weight files were fsynced by their writers, overlapping their hashing
        for extra in extras:
            fsync_path(os.path.join(tmp, extra.name))
    return Manifest(version, files, tensors, tuple(extras), total, digest)


def fsync_path(path: str | os.PathLike) -> None:
    """Flushes a file or a folder (its entries) to disk; the trainer's checkpoints use it too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes(path: str, data: bytes, fsync: bool) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


_fsync_dir = fsync_path


def read_manifest(path: str, expected_manifest_sha256: str | None = None) -> tuple[Manifest, str]:
    """Reads and checks `<path>/manifest.json`; returns it with its sha256.

    Raises NotFound (no such version folder), DataLoss (sha256 differs from the expected one),
    InvalidArgument (malformed manifest, or its version differs from the folder name).
    """
    manifest_path = os.path.join(path, MANIFEST_NAME)
    try:
        with open(manifest_path, "rb") as f:
            raw = f.read()
    except FileNotFoundError as e:
        what = "has no manifest.json (incomplete or not a version folder)" if os.path.isdir(path) else "does not exist"
        raise NotFound(f"weight version folder {path} {what}") from e
    sha = sha256_hex(raw)
    if expected_manifest_sha256 and sha != expected_manifest_sha256:
        raise DataLoss(
            f"{manifest_path} has sha256 {sha}, but {expected_manifest_sha256} was published: "
            "the folder was replaced or altered; ask the trainer to re-publish"
        )
    manifest = Manifest.parse(raw, manifest_path)
    m = _VERSION_DIR.match(os.path.basename(os.path.normpath(path)))
    if m and int(m.group(1)) != manifest.version:
        raise InvalidArgument(
            f"{manifest_path} says version {manifest.version} but the folder is {os.path.basename(path)}"
        )
    return manifest, sha


class VersionReader:
    """An opened, manifest-checked version folder; iterate it for (name, tensor) pairs (CPU).

    Each file is read and (if verify) checked tensor by tensor before any of its tensors is
    handed out. Apply with `apply_to_state`, which takes everything before copying, so a file
    found corrupt after the first one still leaves the replica's weights untouched.
    """

    def __init__(self, path: str, expected_manifest_sha256: str | None = None, verify: bool = True) -> None:
        self.path = path
        self.verify = verify
        self.manifest, self.manifest_sha256 = read_manifest(path, expected_manifest_sha256)
        if verify:
            self._check_extra_files()

    @property
    def version(self) -> int:
        return self.manifest.version

    def names(self) -> list[str]:
        return [e.name for entries in self.manifest.tensors.values() for e in entries]

    def __iter__(self) -> Iterator[NamedTensor]:
        for file, entries in self.manifest.tensors.items():
            path = os.path.join(self.path, file)
            yield from read_file(path, entries, self.manifest.files[file], self.verify, self.manifest.digest)

    def verify_all(self) -> None:
        """Checks every file against the manifest (sizes, headers, digests) without keeping the data."""
        for file, entries in self.manifest.tensors.items():
            verify_file(os.path.join(self.path, file), entries, self.manifest.files[file], self.manifest.digest)

    def copy_into(self, targets: Mapping[str, torch.Tensor]) -> None:
        """Reads every tensor straight into `targets[name]` (same dtype and shape; check first)."""
        for file, entries in self.manifest.tensors.items():
            copy_file_into(os.path.join(self.path, file), entries, self.manifest.files[file], dict(targets))

    def _check_extra_files(self) -> None:
        for extra in self.manifest.extra_files:
            try:
                with open(os.path.join(self.path, extra.name), "rb") as f:
                    data = f.read()
            except OSError as e:
                raise DataLoss(f"{self.path}: extra file {extra.name} is missing ({e})") from e
            if len(data) != extra.nbytes or sha256_hex(data) != extra.sha256:
                raise DataLoss(f"{self.path}: extra file {extra.name} does not match its manifest entry; it is corrupt")


def read_version(path: str, expected_manifest_sha256: str | None = None, verify: bool = True) -> VersionReader:
    """Opens a published version for reading: `for name, tensor in read_version(path): ...`.

    The manifest is checked now (NotFound, DataLoss for a manifest sha256 other than the
    published one, InvalidArgument for a malformed manifest); tensors are checked while
    iterating (DataLoss for a missing, truncated or altered file).
    """
    return VersionReader(path, expected_manifest_sha256, verify)
