"""Checksums of a fixed, deterministic sample of weight tensors, to compare trainer and replicas.

After an update the trainer computes `tensor_checksums(export)` and each replica
`tensor_checksums(its parameters, names=the trainer's names)`; the scheduler compares them with
`compare_checksums` and fails the update loudly on any difference (never silently stale weights).
A tensor's checksum is the sha256 of its dtype, shape and raw little-endian bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import torch

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import DataLoss, InvalidArgument

from . import dtypes

DEFAULT_SAMPLE = 8


def sample_names(names: Iterable[str], count: int = DEFAULT_SAMPLE) -> list[str]:
    """The first and last names in sorted order and `count - 2` evenly spaced ones in between."""
    ordered = sorted(set(names))
    if count <= 0 or len(ordered) <= count:
        return ordered if count > 0 else []
    if count == 1:
        return [ordered[0]]
    step = (len(ordered) - 1) / (count - 1)
    return sorted({ordered[round(i * step)] for i in range(count)})


def tensor_checksum(tensor: torch.Tensor) -> str:
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    h = hashlib.sha256(f"{dtypes.dtype_name(t.dtype)}{list(t.shape)}".encode())
    h.update(memoryview(dtypes.as_bytes(t).numpy()))
    return h.hexdigest()


def tensor_checksums(
    named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    names: Sequence[str] | None = None,
    count: int = DEFAULT_SAMPLE,
) -> dict[str, str]:
    """sha256 hex per sampled tensor: of `names` if given, else of `sample_names(all names, count)`.

    Only the sampled tensors are hashed. Without `names` a lazy export is gathered first to
    learn all names; with them, it is streamed. Raises InvalidArgument for an absent name.
    """
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    if names is None:
        table = dict(items)
        wanted = sample_names(table, count)
    else:
        wanted = list(names)
        want = set(wanted)
        table = {n: t for n, t in items if n in want}
    absent = [n for n in wanted if n not in table]
    if absent:
        raise InvalidArgument(f"checksum sample names {absent[:8]} are not among the tensors; compare the same model")
    return {name: tensor_checksum(table[name]) for name in wanted}


def to_proto(version: int, checksums: Mapping[str, str]) -> weights_pb2.WeightChecksums:
    return weights_pb2.WeightChecksums(version=version, sha256=dict(checksums))


def compare_checksums(
    expected: weights_pb2.WeightChecksums, actual: weights_pb2.WeightChecksums, who: str = "replica"
) -> None:
    """Raises DataLoss naming every difference (version or tensor) between trainer and a replica."""
    problems = []
    if expected.version != actual.version:
        problems.append(f"serves version {actual.version}, expected {expected.version}")
    for name, sha in expected.sha256.items():
        got = actual.sha256.get(name)
        if got is None:
            problems.append(f"no checksum for {name!r}")
        elif got != sha:
            problems.append(f"{name!r} differs")
    if not expected.sha256:
        problems.append("the trainer's checksum sample is empty")
    if problems:
        raise DataLoss(f"{who} weights differ from the trainer's: {'; '.join(problems)}; mark it stale and refit it")
