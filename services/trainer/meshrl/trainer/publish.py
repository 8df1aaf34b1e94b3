"""Weight publication, trainer side: versioned HF folders on disk, or a broadcast over a collective group.

Disk: `<root>/v000007/` is a loadable Hugging Face model folder (config, tokenizer, sharded
safetensors with model.safetensors.index.json, one shard per bucket) plus `manifest.json`
{format, version, files: {name: sha256}, tensors: [{name, file, dtype, shape}], checksums: {name: sha256}},
written into a temporary sibling and renamed into place, so a folder with a manifest is complete.
Distributed: a standalone process group (trainer = rank 0, replicas from rank 1; gloo or NCCL,
rendezvous on a TCPStore the trainer hosts). Per bucket, rank 0 broadcasts an int64 [1] byte length,
then a uint8 tensor holding a serialized `meshrl.common.v1.WeightBucketMeta`, then each tensor of
the bucket in the meta's order (HF name, dtype, shape). Called by `meshrl.trainer.service`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from meshrl.api.common.v1 import tensor_pb2, weights_pb2
from meshrl.common.errors import DeadlineExceeded, InvalidArgument, NotFound, Unavailable
from safetensors.torch import save_file

FORMAT = "meshrl-weights/1"
MANIFEST = "manifest.json"
# Files copied from the source model folder so a version folder loads with from_pretrained.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
PROTO_DTYPES = {
    torch.float32: tensor_pb2.DTYPE_FLOAT32,
    torch.bfloat16: tensor_pb2.DTYPE_BFLOAT16,
    torch.float16: tensor_pb2.DTYPE_FLOAT16,
}
Bucket = list[tuple[str, torch.Tensor]]


def version_dir(root: str | Path, version: int) -> Path:
    return Path(root) / f"v{version:06d}"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class DiskPublication:
    path: str
    version: int
    manifest_sha256: str
    bytes: int
    buckets: int


def publish_to_disk(
    buckets: Iterable[Bucket],
    *,
    root: str | Path,
    version: int,
    model_path: str | Path,
    checksums: dict[str, str],
    keep_last: int = 0,
) -> DiskPublication:
    """Writes version `version` under `root` atomically (replacing a folder of the same version), then
    removes all but the newest `keep_last` versions (0 = keep all)."""
    if version < 0:
        raise InvalidArgument(f"weight version must be >= 0, got {version}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(root, version)
    tmp = root / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        tensors, weight_map, total, count = [], {}, 0, 0
        for count, bucket in enumerate(buckets, start=1):
            name = f"model-{count:05d}.safetensors"
            save_file({n: t.detach().cpu().contiguous() for n, t in bucket}, tmp / name, metadata={"format": "pt"})
            for n, t in bucket:
                weight_map[n] = name
                tensors.append(
                    {"name": n, "file": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                )
                total += t.numel() * t.element_size()
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
        for name in MODEL_FILES:
            if (Path(model_path) / name).is_file():
                shutil.copy2(Path(model_path) / name, tmp / name)
        files = {p.name: _sha256_file(p) for p in sorted(tmp.iterdir())}
        manifest = {
            "format": FORMAT,
            "version": version,
            "created_unix": time.time(),
            "files": files,
            "tensors": tensors,
            "checksums": checksums,
        }
        data = json.dumps(manifest, indent=1, sort_keys=True).encode()
        (tmp / MANIFEST).write_bytes(data)
        for p in tmp.iterdir():
            _fsync(p)
        _fsync(tmp)
        old = None
        if final.exists():
            old = root / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            final.rename(old)
        tmp.rename(final)
        _fsync(root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last > 0:
        versions = sorted(p for p in root.glob("v[0-9]*") if p.is_dir() and (p / MANIFEST).is_file())
        for stale in versions[:-keep_last]:
            shutil.rmtree(stale, ignore_errors=True)
    return DiskPublication(str(final), version, hashlib.sha256(data).hexdigest(), total, count)


@dataclass(frozen=True)
class GroupSpec:
    """Where and how to build the weight-update group (mirrors `meshrl.common.v1.CollectiveGroup`)."""

    master_address: str
    master_port: int
    world_size: int
    rank: int
    name: str
    backend: str = "gloo"
    timeout_seconds: float = 300.0


class WeightGroup:
    """A standalone torch.distributed process group among the trainer (rank 0) and rollout replicas."""

    def __init__(self, spec: GroupSpec) -> None:
        if spec.backend not in ("gloo", "nccl"):
            raise InvalidArgument(f"weight group backend {spec.backend!r} is not 'gloo' or 'nccl'")
        if spec.world_size < 2 or not 0 <= spec.rank < spec.world_size:
            raise InvalidArgument(f"weight group needs world_size >= 2 and rank in range, got {spec}")
        if spec.backend == "nccl" and not torch.cuda.is_available():
            raise InvalidArgument("weight group backend 'nccl' needs CUDA; use 'gloo' on CPU hosts")
        self.spec = spec
        timeout = datetime.timedelta(seconds=spec.timeout_seconds)
        try:
            store = dist.TCPStore(
                spec.master_address,
                spec.master_port,
                spec.world_size,
                is_master=spec.rank == 0,
                timeout=timeout,
                wait_for_workers=True,
            )
        except (RuntimeError, dist.DistStoreError) as err:
            raise DeadlineExceeded(
                f"weight group {spec.name!r}: not every member joined {spec.master_address}:{spec.master_port} "
                f"within {spec.timeout_seconds:.0f}s ({err})"
            ) from None
        self._store = dist.PrefixStore(f"{spec.name}/", store)
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if spec.backend == "nccl" else torch.device("cpu")
        )
        if spec.backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(self._store, spec.rank, spec.world_size)
        else:
            self.pg = dist.ProcessGroupGloo(self._store, spec.rank, spec.world_size, timeout)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = datetime.timedelta(seconds=self.spec.timeout_seconds)
        try:
            self.pg.broadcast([tensor], opts).wait()
        except RuntimeError as err:
            raise Unavailable(f"weight group {self.spec.name!r}: broadcast failed ({err}); rebuild the group") from None

    def send(self, buckets: Iterable[Bucket], num_buckets: int, version: int) -> int:
        """Broadcasts every bucket (meta, then tensors) from rank 0; returns the tensor bytes sent."""
        sent = 0
        for index, bucket in enumerate(buckets):
            meta = weights_pb2.WeightBucketMeta(version=version, bucket_index=index, num_buckets=num_buckets)
            for name, t in bucket:
                if t.dtype not in PROTO_DTYPES:
                    raise InvalidArgument(f"tensor {name!r} has dtype {t.dtype}, which the weight plane does not carry")
                meta.tensors.add(
                    name=name, dtype=PROTO_DTYPES[t.dtype], shape=list(t.shape), nbytes=t.numel() * t.element_size()
                )
            raw = torch.frombuffer(bytearray(meta.SerializeToString()), dtype=torch.uint8).to(self.device)
            self._broadcast(torch.tensor([raw.numel()], dtype=torch.int64, device=self.device))
            self._broadcast(raw)
            for _, t in bucket:
                tensor = t.detach().to(self.device).contiguous()
                self._broadcast(tensor)
                sent += tensor.numel() * tensor.element_size()
        return sent

    def close(self) -> None:
        self.pg = None
        self._store = None


class WeightGroups:
    """The trainer's joined weight groups by name."""

    def __init__(self) -> None:
        self._groups: dict[str, WeightGroup] = {}

    def join(self, spec: GroupSpec) -> WeightGroup:
        if spec.name in self._groups:
            self._groups.pop(spec.name).close()
        group = WeightGroup(spec)
        self._groups[spec.name] = group
        return group

    def get(self, name: str) -> WeightGroup:
        if name not in self._groups:
            raise NotFound(
                f"no weight group named {name!r} (joined: {sorted(self._groups)}); call InitWeightUpdateGroup"
            )
        return self._groups[name]

    def destroy(self, name: str) -> None:
        group = self._groups.pop(name, None)
        if group is not None:
            group.close()
