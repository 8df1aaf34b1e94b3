"""Replica side of the disk transport: stage a published version locally, then load it in place.

The rollout service calls `stage_to_local` while its engine still generates (copying from
shared storage to fast local disk), then pauses and calls `load_version`, which verifies the
whole version before copying anything into the live parameters.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping

import torch

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import InvalidArgument, MeshrlError

from .apply import MAX_LISTED, check_version, find_problems, missing_names, refuse
from .disk import _TMP_PREFIX, gc_versions, read_manifest, read_version
from .manifest import MANIFEST_NAME


def stage_to_local(path: str, local_dir: str, expected_manifest_sha256: str | None = None, keep_last: int = 2) -> str:
    """Copies a published version folder into `local_dir` (atomically) and returns the copy's path.

    A copy already there with the same manifest is reused. Checksums are verified when the copy
    is read, not here (the copy is not fsynced: a torn copy fails verification and is re-staged).
    Older staged versions beyond `keep_last` are removed (0 keeps all).
    Raises NotFound / DataLoss / InvalidArgument like `read_manifest`.
    """
    manifest, sha = read_manifest(path, expected_manifest_sha256)
    name = os.path.basename(os.path.normpath(path))
    dest = os.path.join(local_dir, name)
    if os.path.realpath(dest) == os.path.realpath(path):
        return path
    if _manifest_sha(dest) == sha:
        return dest
    os.makedirs(local_dir, exist_ok=True)
    tmp = os.path.join(local_dir, f"{_TMP_PREFIX}{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(tmp)
    try:
        for file in [*manifest.files, *(x.name for x in manifest.extra_files), MANIFEST_NAME]:
            shutil.copyfile(os.path.join(path, file), os.path.join(tmp, file))
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    gc_versions(local_dir, keep_last)
    return dest


def _manifest_sha(folder: str) -> str | None:
    """The sha256 of an earlier staged copy's manifest; None when there is no readable copy."""
    try:
        return read_manifest(folder)[1]
    except (MeshrlError, OSError):
        return None


def load_version(
    named_params: Mapping[str, torch.Tensor],
    weights: weights_pb2.DiskWeights | str,
    current_version: int,
    verify: bool = True,
) -> int:
    """Loads a published version into `named_params` in place, all or nothing; returns its version.

    Stages it first when DiskWeights.local_staging_dir is set. Then the manifest is checked
    against the parameters (names, dtypes, shapes, none missing) and every file against the
    manifest (sizes, headers, sha256); only then is each tensor read straight into its
    parameter, without a staging copy of the model. Raises like `apply_to_state` and
    `read_version`; on any of those errors no parameter has been touched.
    """
    if isinstance(weights, str):
        weights = weights_pb2.DiskWeights(path=weights)
    path = weights.path
    if weights.local_staging_dir:
        path = stage_to_local(path, weights.local_staging_dir, weights.manifest_sha256 or None)
    reader = read_version(path, weights.manifest_sha256 or None, verify)
    if weights.version and reader.version != weights.version:
        raise InvalidArgument(f"{path} holds version {reader.version}, but version {weights.version} was announced")
    check_version(current_version, reader.version)
    specs = [(e.name, e.dtype, e.shape) for entries in reader.manifest.tensors.values() for e in entries]
    problems, seen = find_problems(named_params, specs)
    missing = missing_names(named_params, seen)
    if missing:
        problems.append(f"{len(missing)} parameter(s) missing from the update, e.g. {missing[:MAX_LISTED]}")
    if problems:
        raise refuse(reader.version, problems)
    if verify:
        reader.verify_all()
    reader.copy_into(named_params)
    return reader.version
