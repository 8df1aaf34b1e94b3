"""Atomic trainer checkpoint directories written by every rank at once: files, verification, RNG states.

Layout of a checkpoint directory (safetensors + JSON, nothing pickled; what the shard files hold is
`meshrl.trainer.checkpoint_shards`):
  meta.json                          role, step, counters, optimizer config, model spec, the saved layout
  data_state.bin                     the caller's opaque bytes (e.g. the dataset position as JSON)
  model-tp{T}-pp{P}.safetensors      one per model-parallel rank: its slice of every parameter it holds
  optim-tp{T}-pp{P}-dp{D}.safetensors  its optimizer state (every DP rank with the distributed optimizer)
  rng-{RANK}.safetensors             each rank's torch CPU (and CUDA) generator states
  COMPLETE                           written last by rank 0: sha256 of every other file
Every rank writes its own files into one temporary sibling directory (on storage that every rank sees, e.g. a
shared filesystem across hosts); once all have fsynced them rank 0 writes COMPLETE and renames the directory
into place, so a crash never leaves a directory that looks complete. Called by `meshrl.trainer.core`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from meshrl.common.errors import DataLoss, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from meshrl.common.weights.disk import fsync_path

FORMAT = "meshrl-trainer-checkpoint/2"
COMPLETE = "COMPLETE"
META = "meta.json"
DATA_STATE = "data_state.bin"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def rng_state() -> dict[str, torch.Tensor]:
    state = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            state[f"torch_cuda_{i}"] = s
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch_cpu"])
    if torch.cuda.is_available():
        cuda = [state[k] for k in sorted(state) if k.startswith("torch_cuda_")]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)


def rng_file(rank: int) -> str:
    return f"rng-{rank:05d}.safetensors"


def all_ok(ok: bool) -> bool:
    """A collective AND over every trainer rank (True in a single process), so a rank that failed fails the
    whole save or load on every rank instead of leaving the others waiting."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def agree(error: BaseException | None, what: str) -> None:
    """Raises `error` on the rank that had it and Unavailable on the others, unless every rank succeeded."""
    if not all_ok(error is None):
        if error is not None:
            raise error
        raise Unavailable(f"another trainer rank failed to {what}; see that rank's log")


def write_collective(
    path: str | Path, rank: int, write: Callable[[Path], None], meta: dict[str, Any], data_state: bytes
) -> int:
    """Every rank calls this together: `write(tmp_dir)` writes this rank's files; rank 0 adds meta.json and
    data_state.bin, then COMPLETE, and renames the directory to `path` (replacing an existing checkpoint).
    Returns the checkpoint's bytes on rank 0 (0 elsewhere)."""
    final = Path(path)
    tmp = final.parent / f".{final.name}.tmp-partial"  # one name every rank derives alike
    error = None
    if rank == 0:
        try:
            if final.exists() and not (final / COMPLETE).is_file():  # replacing it would delete someone's folder
                raise FailedPrecondition(
                    f"checkpoint path {final} exists and is not a checkpoint (no {COMPLETE}); a save replaces only "
                    "an earlier checkpoint. Fix: name a new folder",
                    field="path",
                )
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        except (OSError, FailedPrecondition) as exc:
            error = exc
    agree(error, "create the checkpoint directory")
    try:
        write(tmp)
        if rank == 0:
            (tmp / META).write_text(json.dumps({"format": FORMAT, **meta}, indent=1, sort_keys=True))
            (tmp / DATA_STATE).write_bytes(bytes(data_state))
        for file in tmp.iterdir():
            if file.is_file():
                fsync_path(file)
    except Exception as exc:  # noqa: BLE001 - agreed on below, then re-raised
        error = exc
    try:
        agree(error, "write its checkpoint files")
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = 0
    if rank == 0:
        try:
            size = _seal(tmp, final)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            error = exc
    agree(error, "complete the checkpoint")
    return size


def _seal(tmp: Path, final: Path) -> int:
    files = {f.name: _sha256(f) for f in sorted(tmp.iterdir()) if f.is_file()}
    (tmp / COMPLETE).write_text(json.dumps({"format": FORMAT, "sha256": files}, indent=1, sort_keys=True))
    fsync_path(tmp / COMPLETE)
    fsync_path(tmp)
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        final.rename(old)
    tmp.rename(final)
    fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return sum(f.stat().st_size for f in final.iterdir())


def save_tensors(tensors: dict[str, torch.Tensor], file: Path, metadata: dict[str, Any] | None = None) -> None:
    """One safetensors file of CPU tensors; `metadata` (JSON-able) is kept in its header under "meshrl"."""
    header = {"meshrl": json.dumps(metadata, sort_keys=True)} if metadata is not None else None
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, file, metadata=header)


class CheckpointDir:
    """A complete checkpoint opened for reading: its manifest and meta; files are verified when asked for."""

    def __init__(self, path: str | Path) -> None:
        root = Path(path)
        if not root.is_dir():
            raise NotFound(f"no checkpoint directory at {str(root)!r}")
        if not (root / COMPLETE).is_file():
            raise FailedPrecondition(
                f"checkpoint {str(root)!r} has no COMPLETE marker: it was not fully written; use an earlier checkpoint"
            )
        try:
            manifest = json.loads((root / COMPLETE).read_text())
        except json.JSONDecodeError as err:
            raise DataLoss(f"checkpoint {str(root)!r}: COMPLETE is not valid JSON ({err})") from None
        if manifest.get("format") != FORMAT:
            raise InvalidArgument(
                f"checkpoint {str(root)!r} has format {manifest.get('format')!r}, this trainer reads {FORMAT!r}; "
                "resume it with the trainer version that wrote it"
            )
        self.root = root
        self.sha256: dict[str, str] = manifest["sha256"]
        self.verify([META, DATA_STATE])
        self.meta: dict[str, Any] = json.loads((root / META).read_text())

    def has(self, name: str) -> bool:
        return name in self.sha256

    def verify(self, names: Iterable[str]) -> None:
        """Raises DataLoss unless every named file is listed in COMPLETE and matches its sha256."""
        for name in names:
            file = self.root / name
            if name not in self.sha256 or not file.is_file() or _sha256(file) != self.sha256[name]:
                raise DataLoss(f"checkpoint {str(self.root)!r}: {name} is missing or corrupt (sha256 mismatch)")

    def data_state(self) -> bytes:
        return (self.root / DATA_STATE).read_bytes()

    def rng(self, rank: int) -> dict[str, torch.Tensor]:
        """The RNG states saved by `rank`, or rank 0's when the saved world had fewer ranks."""
        name = rng_file(rank) if self.has(rng_file(rank)) else rng_file(0)
        self.verify([name])
        return load_file(self.root / name)
