"""The replica side of the weight plane: verify and read a published version folder, join the
weight-update group and receive a version over it, copy tensors into live parameters, hash them.

Speaks the trainer's protocol (meshrl.trainer.publish, described in its docstring): a version folder
holds HF safetensors plus `manifest.json` {format, version, files: {file: sha256}, tensors: [{name,
file, dtype, shape}], checksums}; the collective is a standalone process group on a TCPStore hosted
by trainer rank 0 (PrefixStore "<group>/"), and per bucket rank 0 broadcasts an int64 [1] length, a
uint8 serialized WeightBucketMeta, then each tensor in the meta's order. Used by every engine.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from meshrl.api.common.v1 import tensor_pb2, weights_pb2
from meshrl.common.errors import DataLoss, DeadlineExceeded, InvalidArgument, NotFound, Unavailable
from meshrl.rollout.types import CollectiveGroupSpec
from safetensors import safe_open

MANIFEST = "manifest.json"
FORMAT = "meshrl-weights/1"
TORCH_DTYPES = {
    tensor_pb2.DTYPE_FLOAT32: torch.float32,
    tensor_pb2.DTYPE_BFLOAT16: torch.bfloat16,
    tensor_pb2.DTYPE_FLOAT16: torch.float16,
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_VERSION_DIR = re.compile(r"^v(\d+)$")


@dataclass
class Staged:
    """A complete, verified weight version held in memory, not yet applied."""

    version: int
    tensors: dict[str, torch.Tensor]
    seconds: float
    folder: str = ""  # where it was read from ("" when it came over the group)

    def seconds_total(self) -> float:
        return self.seconds

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 hex of the tensor's raw bytes (C-contiguous, CPU, own dtype): the trainer's definition."""
    t = tensor.detach().to("cpu").contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def checksum_sample(names: Iterable[str]) -> list[str]:
    """The fixed sample both sides hash: every non-layer tensor plus every tensor of the first and last layer."""
    names = list(names)
    layers = [int(m.group(1)) for n in names if (m := _LAYER.match(n))]
    keep = {min(layers), max(layers)} if layers else set()
    return [n for n in names if not (m := _LAYER.match(n)) or int(m.group(1)) in keep]


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(folder: str | Path, version: int | None = None, manifest_sha256: str = "") -> dict:
    """The manifest of a version folder, checked against the expected sha256 and version."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise NotFound(f"{folder} has no {MANIFEST}: it is not a complete published weight version")
    raw = path.read_bytes()
    if manifest_sha256 and hashlib.sha256(raw).hexdigest() != manifest_sha256:
        raise DataLoss(
            f"{path} does not match the announced sha256 {manifest_sha256[:12]}…; it was changed or replaced"
        )
    try:
        manifest = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DataLoss(f"{path} is not valid JSON ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise InvalidArgument(f"{path} has format {manifest.get('format')!r}; this replica reads {FORMAT!r}")
    if version is not None and int(manifest.get("version", -1)) != version:
        raise InvalidArgument(f"{folder} holds weight version {manifest.get('version')}, not the announced {version}")
    return manifest


def verify_files(folder: str | Path, manifest: Mapping) -> None:
    """Every file the manifest lists exists with its sha256 (a corrupted or truncated file is DATA_LOSS)."""
    for name, expected in sorted(manifest.get("files", {}).items()):
        path = Path(folder) / name
        if not path.is_file():
            raise DataLoss(f"{path} is listed in the manifest but missing")
        if _sha256_file(path) != expected:
            raise DataLoss(f"{path} does not match its manifest checksum: the file is corrupted; republish it")


def newest_version(root: str | Path) -> Path | None:
    """The newest complete version folder (vNNNNNN with a manifest) under `root`, or `root` itself if it is one."""
    root = Path(root)
    if (root / MANIFEST).is_file():
        return root
    versions = [
        (int(m.group(1)), p)
        for p in root.glob("v*")
        if p.is_dir() and (m := _VERSION_DIR.match(p.name)) and (p / MANIFEST).is_file()
    ]
    return max(versions)[1] if versions else None


def stage_copy(folder: str | Path, staging_dir: str | Path) -> Path:
    """Copies a version folder into `staging_dir` (atomically: temporary name, then rename)."""
    src = Path(folder)
    dst = Path(staging_dir) / src.name
    if dst.exists():
        shutil.rmtree(dst)
    tmp = Path(staging_dir) / f".{src.name}.tmp-{uuid.uuid4().hex[:8]}"
    Path(staging_dir).mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, tmp)
    tmp.rename(dst)
    return dst


def read_disk(
    path: str, version: int, manifest_sha256: str = "", staging_dir: str = "", *, load: bool = True
) -> Staged:
    """Verifies a version folder (manifest, file checksums, tensor list) and reads its tensors (CPU)."""
    start = time.perf_counter()
    manifest = read_manifest(path, version, manifest_sha256)
    folder = Path(path)
    if staging_dir:
        folder = stage_copy(folder, staging_dir)
        read_manifest(folder, version, manifest_sha256)
    verify_files(folder, manifest)
    tensors: dict[str, torch.Tensor] = {}
    if load:
        for entry in manifest.get("tensors", []):
            with safe_open(str(folder / entry["file"]), framework="pt") as f:
                if entry["name"] not in f.keys():
                    raise DataLoss(f"{entry['file']} lacks tensor {entry['name']!r} that the manifest lists")
                t = f.get_tensor(entry["name"])
            if list(t.shape) != list(entry["shape"]) or str(t.dtype).removeprefix("torch.") != entry["dtype"]:
                raise DataLoss(f"tensor {entry['name']!r} in {entry['file']} is not {entry['dtype']} {entry['shape']}")
            tensors[entry["name"]] = t
    return Staged(version, tensors, time.perf_counter() - start, str(folder))


class _Group:
    """This replica's membership of one weight-update group (receiver side)."""

    def __init__(self, spec: CollectiveGroupSpec, device: torch.device) -> None:
        if spec.backend not in ("gloo", "nccl"):
            raise InvalidArgument(f"weight group backend {spec.backend!r} is not 'gloo' or 'nccl'")
        if spec.world_size < 2 or not 1 <= spec.rank_offset < spec.world_size:
            raise InvalidArgument(
                f"weight group {spec.group_name!r}: rank_offset {spec.rank_offset} must be in [1, {spec.world_size})"
            )
        if spec.backend == "nccl" and not torch.cuda.is_available():
            raise InvalidArgument("weight group backend 'nccl' needs CUDA; use 'gloo' on CPU hosts")
        self.spec = spec
        self.timeout = datetime.timedelta(seconds=spec.timeout_seconds)
        try:
            store = dist.TCPStore(
                spec.master_address, spec.master_port, spec.world_size, is_master=False, timeout=self.timeout
            )
            prefixed = dist.PrefixStore(f"{spec.group_name}/", store)
            if spec.backend == "nccl":
                self.device = device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
                self.pg = dist.ProcessGroupNCCL(prefixed, spec.rank_offset, spec.world_size)
            else:
                self.device = torch.device("cpu")
                self.pg = dist.ProcessGroupGloo(prefixed, spec.rank_offset, spec.world_size, self.timeout)
        except (RuntimeError, dist.DistStoreError) as err:
            raise DeadlineExceeded(
                f"weight group {spec.group_name!r}: could not join {spec.master_address}:{spec.master_port} "
                f"within {spec.timeout_seconds:.0f}s ({err})"
            ) from None
        self._store = prefixed

    def recv(self, tensor: torch.Tensor, timeout_s: float) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = datetime.timedelta(seconds=timeout_s)
        try:
            self.pg.broadcast([tensor], opts).wait()
        except RuntimeError as err:
            raise Unavailable(
                f"weight group {self.spec.group_name!r}: broadcast failed or timed out ({err}); rebuild the group"
            ) from None

    def receive(self, version: int, timeout_s: float) -> dict[str, torch.Tensor]:
        """Every bucket of one version: (length, meta bytes, tensors...) per bucket until the last one."""
        received: dict[str, torch.Tensor] = {}
        deadline = time.monotonic() + timeout_s
        bucket, num_buckets = 0, 1
        while bucket < num_buckets:
            left = max(1.0, deadline - time.monotonic())
            length = torch.zeros(1, dtype=torch.int64, device=self.device)
            self.recv(length, left)
            raw = torch.empty(int(length.item()), dtype=torch.uint8, device=self.device)
            self.recv(raw, left)
            meta = weights_pb2.WeightBucketMeta.FromString(raw.cpu().numpy().tobytes())
            num_buckets = meta.num_buckets
            for spec in meta.tensors:
                if spec.dtype not in TORCH_DTYPES:
                    raise InvalidArgument(f"weight tensor {spec.name!r} has unsupported dtype {spec.dtype}")
                t = torch.empty(tuple(spec.shape), dtype=TORCH_DTYPES[spec.dtype], device=self.device)
                self.recv(t, max(1.0, deadline - time.monotonic()))
                received[spec.name] = t
            if meta.version != version:
                raise InvalidArgument(f"the trainer broadcast weight version {meta.version}, expected {version}")
            bucket = meta.bucket_index + 1
        return received


class WeightReceiver:
    """Applies published weights to a live model: `params()` gives its tensors under HF names."""

    def __init__(self, params: Callable[[], dict[str, torch.Tensor]], device: torch.device | str = "cpu") -> None:
        self.params = params
        self.device = torch.device(device)
        self._groups: dict[str, _Group] = {}

    # --- disk -------------------------------------------------------------------------------------
    def read_disk(self, path: str, version: int, manifest_sha256: str = "", staging_dir: str = "") -> Staged:
        return read_disk(path, version, manifest_sha256, staging_dir)

    # --- collective -------------------------------------------------------------------------------
    def join_group(self, spec: CollectiveGroupSpec) -> int:
        old = self._groups.pop(spec.group_name, None)
        del old
        self._groups[spec.group_name] = _Group(spec, self.device)
        return spec.rank_offset

    def receive(self, group_name: str, version: int, timeout_s: float) -> Staged:
        group = self._groups.get(group_name)
        if group is None:
            raise NotFound(f"no weight group {group_name!r} was joined (joined: {sorted(self._groups)}); call "
                           "InitWeightUpdateGroup first")  # fmt: skip
        start = time.perf_counter()
        tensors = group.receive(version, timeout_s)
        return Staged(version, tensors, time.perf_counter() - start)

    def leave_group(self, group_name: str) -> None:
        self._groups.pop(group_name, None)

    def close(self) -> None:
        self._groups.clear()

    # --- the live model -----------------------------------------------------------------------------
    def exported_names(self) -> list[str]:
        """The model's tensor names as a checkpoint holds them (a tied lm_head is not a separate tensor)."""
        seen: set[int] = set()
        names = []
        for name, t in self.params().items():
            key = t.data_ptr()
            if key in seen and name == "lm_head.weight":
                continue
            seen.add(key)
            names.append(name)
        return names

    def check(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Refuses (changing nothing) an update with unknown, missing or misshapen tensors."""
        params = self.params()
        unknown = sorted(set(tensors) - set(params))
        if unknown:
            raise InvalidArgument(f"weight update has tensors this model does not have: {unknown[:5]}")
        missing = sorted(set(self.exported_names()) - set(tensors))
        if missing:
            raise InvalidArgument(f"weight update lacks {len(missing)} tensors of the model, e.g. {missing[:5]}")
        for name, t in tensors.items():
            if tuple(t.shape) != tuple(params[name].shape):
                raise InvalidArgument(
                    f"weight {name!r} has shape {list(t.shape)} but the model's is {list(params[name].shape)}"
                )

    def apply(self, tensors: Mapping[str, torch.Tensor]) -> int:
        """Copies every tensor into the existing parameter storage (no re-allocation); returns the bytes."""
        self.check(tensors)
        params = self.params()
        total = 0
        with torch.no_grad():
            for name, t in tensors.items():
                params[name].copy_(t)
                total += t.numel() * t.element_size()
        return total

    def checksums(self, names: Sequence[str] = ()) -> dict[str, str]:
        params = self.params()
        wanted = list(names) or checksum_sample(self.exported_names())
        unknown = [n for n in wanted if n not in params]
        if unknown:
            raise NotFound(f"no model tensor named {unknown[0]!r}; names are HF tensor names like 'model.norm.weight'")
        return {n: tensor_sha256(params[n]) for n in wanted}
