"""Per-parameter optimizer state of a Megatron optimizer, read and written in the model's own shapes, for
checkpoints: Adam's moments and the fp32 master weights (under bf16), of the plain optimizer (whole tensors
shaped like this rank's parameter) and of the distributed optimizer (the contiguous part of the flattened
parameter that this data-parallel rank owns). Called by `meshrl.trainer.checkpoint_shards`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from meshrl.common.errors import InvalidArgument

MAIN_PARAM = "main_param"  # the fp32 master copy of a lower-precision parameter


@dataclass(frozen=True)
class Slot:
    """Where one model parameter's optimizer state lives on this rank."""

    torch_optimizer: torch.optim.Optimizer
    main: torch.Tensor  # the tensor the state is keyed by (the fp32 master / shard under the distributed optimizer)
    flat_range: tuple[int, int] | None  # distributed optimizer: [start, end) of the flattened parameter; else None


def _inners(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def is_distributed(optimizer) -> bool:
    return any(hasattr(inner, "model_param_group_index_map") for inner in _inners(optimizer))


def slot(optimizer, param: torch.nn.Parameter) -> Slot | None:
    """The parameter's optimizer slot on this rank; None when the distributed optimizer gave all of it to other
    data-parallel ranks. Raises InvalidArgument when no optimizer manages it."""
    distributed = False
    for inner in _inners(optimizer):
        index = getattr(inner, "model_param_group_index_map", None)
        if index is not None:  # Megatron's DistributedOptimizer
            distributed = True
            if param in index:
                group, order = index[param]
                main = inner.optimizer.param_groups[group]["params"][order]
                owned = inner._get_model_param_range_map(param)["param"]
                return Slot(inner.optimizer, main, (owned.start, owned.end))
            continue
        main = getattr(param, "main_param", param)
        torch_opt = inner.optimizer
        if any(main is q for g in torch_opt.param_groups for q in g["params"]):
            return Slot(torch_opt, main, None)
    if distributed:
        return None
    raise InvalidArgument("a model parameter is not managed by the role's optimizer")


def read_state(optimizer, param: torch.nn.Parameter) -> tuple[tuple[int, int] | None, dict[str, torch.Tensor]]:
    """(flat range or None, {state key: tensor}) of one parameter on this rank: tensor states only (Adam's step
    count is restored from the role's step counter), plus the master weights when they differ in dtype."""
    where = slot(optimizer, param)
    if where is None:
        return None, {}
    out = {}
    if where.main.dtype != param.dtype:
        out[MAIN_PARAM] = where.main.detach()
    for key, value in where.torch_optimizer.state.get(where.main, {}).items():
        if torch.is_tensor(value) and value.shape == where.main.shape:
            out[key] = value.detach()
    return where.flat_range, out


def write_state(optimizer, param: torch.nn.Parameter, key: str, local: torch.Tensor, steps: int) -> None:
    """Sets state `key` of `param` from `local` (shaped like this rank's parameter; the distributed optimizer
    keeps only its owned range)."""
    where = slot(optimizer, param)
    if where is None:
        return
    value = local.reshape(-1)[where.flat_range[0] : where.flat_range[1]] if where.flat_range else local
    if key == MAIN_PARAM:
        with torch.no_grad():
            where.main.copy_(value.reshape(where.main.shape).to(where.main.dtype))
        return
    state = where.torch_optimizer.state[where.main]
    if "step" not in state and key.startswith("exp_avg"):
        state["step"] = torch.tensor(float(steps))
    state[key] = value.reshape(where.main.shape).to(device=where.main.device, dtype=where.main.dtype).clone()
