"""Exports a trainer model as HF-named tensors: size-bounded buckets for weight publication, checksums.

`iter_hf_buckets` feeds both weight transports of `meshrl.common.weights` (versioned disk folders
and the collective broadcast); `weight_checksums` hashes that package's fixed sample of HF-named
tensors, exactly as rollout replicas hash theirs, so the scheduler can compare them after an update.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from meshrl.common.errors import NotFound
from meshrl.common.weights import DEFAULT_BUCKET_BYTES, iter_buckets, tensor_checksums
from meshrl.trainer.hf_config import ModelSpec
from meshrl.trainer.hf_weights import iter_hf_tensors

__all__ = ["DEFAULT_BUCKET_BYTES", "iter_hf_buckets", "weight_checksums"]


def iter_hf_buckets(
    model: torch.nn.Module, spec: ModelSpec, bucket_bytes: int = DEFAULT_BUCKET_BYTES, *, value_head: bool = False
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """HF-named tensors of `model` (HF shapes, model dtype and device, contiguous) in buckets of at most
    `bucket_bytes` bytes each (64-byte aligned sizes); a single larger tensor forms its own bucket.
    Tensors are produced lazily, one bucket at a time."""
    yield from iter_buckets(iter_hf_tensors(model, spec, value_head=value_head), bucket_bytes)


def weight_checksums(
    model: torch.nn.Module, spec: ModelSpec, names: Iterable[str] | None = None, *, value_head: bool = False
) -> dict[str, str]:
    """{HF name: sha256 hex} over `names` (default: `meshrl.common.weights.sample_names` of every
    exported tensor), hashed by `meshrl.common.weights.tensor_checksum` (dtype, shape and raw bytes)."""
    tensors = iter_hf_tensors(model, spec, value_head=value_head)
    if names is None:
        return tensor_checksums(tensors)
    wanted = list(names)
    table = {n: t for n, t in tensors if n in set(wanted)}
    unknown = [n for n in wanted if n not in table]
    if unknown:
        raise NotFound(f"no exported tensor named {unknown[0]!r}; names are HF tensor names like 'model.norm.weight'")
    return tensor_checksums(table, names=wanted)
