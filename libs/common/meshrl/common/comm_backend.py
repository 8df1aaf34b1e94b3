"""The one place that picks a torch.distributed backend: NCCL when the ranks hold CUDA devices, gloo
otherwise. Used by the trainer's data- and model-parallel ranks (`data_parallel.backend`), the
scheduler's weight-update group (`weights.backend`) and the replicas' receivers.

`auto` resolves per device; `nccl` without CUDA is a ConfigError naming the field, never a hang later.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from meshrl.common.errors import ConfigError


class CommBackend(str, enum.Enum):
    """What a config may ask for (`auto | nccl | gloo`)."""

    AUTO = "auto"
    NCCL = "nccl"
    GLOO = "gloo"


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def is_cuda_device(device: str) -> bool:
    """ "cuda", "cuda:1" -> True; "cpu", "" -> False."""
    return str(device).strip().lower().startswith("cuda")


def resolve_backend(requested: CommBackend | str, field: str, devices: Iterable[str] | None = None) -> str:
    """ "nccl" or "gloo" for ranks on `devices` (default: this process's own: CUDA if visible).

    auto: nccl when every device is a CUDA device, else gloo. nccl with any non-CUDA rank: ConfigError
    naming `field`. gloo is always allowed (it runs on CPU tensors; CUDA ranks copy through the host)."""
    try:
        wanted = CommBackend(requested)
    except ValueError:
        raise ConfigError(field, requested, "is not a backend", "use one of auto, nccl, gloo") from None
    held = list(devices) if devices is not None else (["cuda"] if cuda_available() else ["cpu"])
    on_cuda = bool(held) and all(is_cuda_device(d) for d in held)
    if wanted is CommBackend.AUTO:
        return "nccl" if on_cuda else "gloo"
    if wanted is CommBackend.NCCL and not on_cuda:
        where = ", ".join(sorted({d or "unknown" for d in held if not is_cuda_device(d)})) or "none"
        raise ConfigError(
            field,
            "nccl",
            f"NCCL needs a CUDA device on every rank, and some ranks hold {where}",
            "set it to auto (NCCL on GPUs, gloo on CPUs) or gloo",
        )
    return wanted.value
