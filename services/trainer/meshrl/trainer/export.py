"""Exports a trainer model as HF-named tensors: size-bounded buckets for weight publication, checksums.

`iter_hf_buckets` feeds both weight transports (disk safetensors versions and collective broadcast);
`weight_checksums` hashes a fixed sample of HF-named tensors so the trainer and every rollout replica
can compare weights after an update (the replica hashes the same names the same way:
sha256 over the tensor's raw little-endian C-contiguous bytes in its own dtype).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator

import torch
from meshrl.common.errors import InvalidArgument, NotFound
from meshrl.trainer.hf_config import ModelSpec
from meshrl.trainer.hf_weights import iter_hf_tensors, weight_mappings

DEFAULT_BUCKET_BYTES = 512 << 20
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def bucketize(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Groups (name, tensor) pairs in order into lists of at most `bucket_bytes` (a larger tensor alone)."""
    if bucket_bytes <= 0:
        raise InvalidArgument(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        n = tensor_nbytes(tensor)
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += n
    if bucket:
        yield bucket


def iter_hf_buckets(
    model: torch.nn.Module, spec: ModelSpec, bucket_bytes: int = DEFAULT_BUCKET_BYTES, *, value_head: bool = False
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """HF-named tensors of `model` (HF shapes, model dtype and device, contiguous) in buckets of at most
    `bucket_bytes` bytes each; a single tensor larger than that forms its own bucket."""
    yield from bucketize(iter_hf_tensors(model, spec, value_head=value_head), bucket_bytes)


def count_hf_buckets(
    model: torch.nn.Module, spec: ModelSpec, bucket_bytes: int = DEFAULT_BUCKET_BYTES, *, value_head: bool = False
) -> int:
    """How many buckets `iter_hf_buckets` will yield, computed on shapes only (no tensor is materialised)."""
    params = dict(model.named_parameters())
    metas = (
        (name, part)
        for m in weight_mappings(spec, value_head=value_head)
        for name, part in zip(m.hf, m.split(torch.empty_like(params[m.megatron], device="meta")), strict=True)
    )
    return sum(1 for _ in bucketize(metas, bucket_bytes))


def checksum_sample(names: Iterable[str]) -> list[str]:
    """The fixed sample hashed by weight checksums: every non-layer tensor plus all tensors of the first
    and the last decoder layer (enough to catch a stale, partial or reordered update, cheap on big models)."""
    names = list(names)
    layers = [int(m.group(1)) for n in names if (m := _LAYER.match(n))]
    keep = {min(layers), max(layers)} if layers else set()
    return [n for n in names if not (m := _LAYER.match(n)) or int(m.group(1)) in keep]


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 hex of the tensor's raw bytes (C-contiguous, CPU, its own dtype)."""
    t = tensor.detach().to("cpu").contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def weight_checksums(
    model: torch.nn.Module, spec: ModelSpec, names: Iterable[str] | None = None, *, value_head: bool = False
) -> dict[str, str]:
    """{HF name: sha256 hex} over `names` (default: checksum_sample of every exported tensor)."""
    tensors = dict(iter_hf_tensors(model, spec, value_head=value_head))
    wanted = checksum_sample(tensors) if names is None else list(names)
    unknown = [n for n in wanted if n not in tensors]
    if unknown:
        raise NotFound(f"no exported tensor named {unknown[0]!r}; names are HF tensor names like 'model.norm.weight'")
    return {n: tensor_sha256(tensors[n]) for n in wanted}
