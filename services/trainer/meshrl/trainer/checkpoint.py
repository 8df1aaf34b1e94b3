"""Atomic trainer checkpoints: model, optimizer, RNG, step and the job's opaque data position.

Layout of a checkpoint directory (safetensors + JSON, nothing pickled):
  model.safetensors      megatron-core parameter names -> tensors
  optimizer.safetensors  "<param name>/<state key>" -> AdamW state tensors (absent for frozen roles)
  rng.safetensors        torch CPU (and CUDA) generator states
  meta.json              role, step, optimizer step, optimizer param groups, model spec, source model path
  data_state.bin         the caller's opaque bytes (e.g. the dataset position as JSON)
  COMPLETE               written last: sha256 of every other file
Everything is written into a temporary sibling directory, fsynced, then renamed into place, so a
crash never leaves a directory that looks complete. Called by `meshrl.trainer.core`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from meshrl.common.errors import DataLoss, FailedPrecondition, InvalidArgument, NotFound

FORMAT = "meshrl-trainer-checkpoint/1"
COMPLETE = "COMPLETE"
_FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors", "meta.json", "data_state.bin")


def _sha256(path: Path) -> str:
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


def _state_owner(optimizer, param: torch.nn.Parameter):
    """The inner torch optimizer and the tensor its state is keyed by (the fp32 master copy under bf16)."""
    main = getattr(param, "main_param", param)
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if "DistributedOptimizer" in type(inner).__name__:
            raise FailedPrecondition(
                "checkpoints do not hold the distributed optimizer's sharded state; set optimizer.distributed=false "
                "for roles that are checkpointed"
            )
        torch_opt = inner.optimizer
        if any(main is q for g in torch_opt.param_groups for q in g["params"]):
            return torch_opt, main
    raise InvalidArgument("a model parameter is not managed by the role's optimizer")


def optimizer_state(optimizer, params: dict[str, torch.nn.Parameter]) -> dict[str, dict[str, torch.Tensor]]:
    """{state key: {local param name: tensor shaped like the param}}: Adam's moments, and the fp32 master
    weights ("main_param") under bf16. Every rank of a layout returns the same keys (scalar states such as
    Adam's step count are restored from the step counter)."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, param in params.items():
        torch_opt, main = _state_owner(optimizer, param)
        if main is not param:
            out.setdefault("main_param", {})[name] = main.detach()
        for key, value in torch_opt.state.get(main, {}).items():
            if torch.is_tensor(value) and value.shape == main.shape:
                out.setdefault(key, {})[name] = value.detach()
    return out


def restore_optimizer_state(optimizer, params: dict[str, torch.nn.Parameter], key: str, name: str,
                            value: torch.Tensor, steps: int) -> None:  # fmt: skip
    """Sets one state tensor (this rank's slice) of the optimizer state of `params[name]`."""
    torch_opt, main = _state_owner(optimizer, params[name])
    if key == "main_param":
        with torch.no_grad():
            main.copy_(value.to(main.dtype))
        return
    state = torch_opt.state[main]
    if "step" not in state and key.startswith("exp_avg"):
        state["step"] = torch.tensor(float(steps))
    state[key] = value.to(device=main.device, dtype=main.dtype).clone()


@dataclass
class LoadedCheckpoint:
    meta: dict[str, Any]
    model: dict[str, torch.Tensor]
    optimizer: dict[str, torch.Tensor] | None
    rng: dict[str, torch.Tensor]
    data_state: bytes


def save_checkpoint(
    path: str | Path,
    *,
    model: dict[str, torch.Tensor],
    optimizer: dict[str, torch.Tensor] | None,
    meta: dict[str, Any],
    data_state: bytes = b"",
) -> int:
    """Writes a complete checkpoint at `path` atomically (replacing an existing one); returns its bytes."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.items()}, tmp / "model.safetensors")
        if optimizer is not None:
            save_file(optimizer, tmp / "optimizer.safetensors")
        save_file({k: v.contiguous() for k, v in rng_state().items()}, tmp / "rng.safetensors")
        (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, **meta}, indent=1, sort_keys=True))
        (tmp / "data_state.bin").write_bytes(bytes(data_state))
        files = {name: _sha256(tmp / name) for name in _FILES if (tmp / name).exists()}
        for name in files:
            _fsync(tmp / name)
        (tmp / COMPLETE).write_text(json.dumps({"format": FORMAT, "sha256": files}, indent=1, sort_keys=True))
        _fsync(tmp / COMPLETE)
        _fsync(tmp)
        old = None
        if final.exists():
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            final.rename(old)
        tmp.rename(final)
        _fsync(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sum(f.stat().st_size for f in final.iterdir())


def is_complete(path: str | Path) -> bool:
    return (Path(path) / COMPLETE).is_file()


def read_checkpoint(path: str | Path) -> LoadedCheckpoint:
    """Reads and verifies a checkpoint (every file's sha256 against COMPLETE)."""
    root = Path(path)
    if not root.is_dir():
        raise NotFound(f"no checkpoint directory at {str(root)!r}")
    if not is_complete(root):
        raise FailedPrecondition(
            f"checkpoint {str(root)!r} has no COMPLETE marker: it was not fully written; use an earlier checkpoint"
        )
    try:
        manifest = json.loads((root / COMPLETE).read_text())
    except json.JSONDecodeError as err:
        raise DataLoss(f"checkpoint {str(root)!r}: COMPLETE is not valid JSON ({err})") from None
    if manifest.get("format") != FORMAT:
        raise InvalidArgument(f"checkpoint {str(root)!r} has format {manifest.get('format')!r}, expected {FORMAT!r}")
    for name, digest in manifest["sha256"].items():
        if not (root / name).is_file() or _sha256(root / name) != digest:
            raise DataLoss(f"checkpoint {str(root)!r}: {name} is missing or corrupt (sha256 mismatch)")
    optimizer = load_file(root / "optimizer.safetensors") if "optimizer.safetensors" in manifest["sha256"] else None
    return LoadedCheckpoint(
        meta=json.loads((root / "meta.json").read_text()),
        model=load_file(root / "model.safetensors"),
        optimizer=optimizer,
        rng=load_file(root / "rng.safetensors"),
        data_state=(root / "data_state.bin").read_bytes(),
    )
