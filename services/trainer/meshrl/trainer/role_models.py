"""Building one role's model on this process: a megatron-core GPTModel (critic: + value head) from a Hugging Face
folder, sharded to the process's layout, or copied from another loaded role; actor and critic get an optimizer,
the reference is frozen. Called by `TrainerCore.load_model` (the reward role has its own: reward_model.py)."""

from __future__ import annotations

import torch

from meshrl.common.errors import InvalidArgument
from meshrl.trainer.hf_config import read_hf_config
from meshrl.trainer.hf_weights import read_hf_tensors
from meshrl.trainer.model import build_gpt_model, parse_dtype
from meshrl.trainer.optim import OptimizerConfig, build_optimizer, wrap_ddp
from meshrl.trainer.parallel import Layout
from meshrl.trainer.roles import RoleState
from meshrl.trainer.sharding import load_sharded


def build_role(
    role: str,
    path: str,
    layout: Layout,
    *,
    dtype: str = "float32",
    optimizer: OptimizerConfig | None = None,
    seed: int = 0,
    gradient_checkpointing: bool = False,
    source: RoleState | None = None,
) -> RoleState:
    """`role`'s model from the folder `path`, or (`source` given) with the weights and model path of that
    loaded role; a critic copying an actor keeps a fresh value head."""
    if source is not None:
        path = source.model_path
    spec = source.spec if source is not None else read_hf_config(path)
    torch_dtype = parse_dtype(dtype)
    model = build_gpt_model(
        spec,
        dtype=torch_dtype,
        value_head=role == "critic",
        seed=seed,
        gradient_checkpointing=gradient_checkpointing,
    )
    if source is not None:
        copy_parameters(source.model, model, keep_head=(role == "critic") != source.value_head)
    else:
        load_sharded(model, read_hf_tensors(path), spec, layout, value_head=role == "critic")
    state = RoleState(role, str(path), spec, model, dtype, layout=layout)
    state.names = {id(p): n for n, p in model.named_parameters()}
    if role == "reference":
        model.eval().requires_grad_(False)
    else:
        state.optimizer_config = optimizer or OptimizerConfig()
        state.ddp = wrap_ddp(model, distributed=state.optimizer_config.distributed)
        state.optimizer = build_optimizer(state.ddp, state.optimizer_config, torch_dtype)
    return state


def copy_parameters(source: torch.nn.Module, target: torch.nn.Module, *, keep_head: bool) -> None:
    """Copies this rank's parameters of `source` into the same-layout `target` (keep_head: the target keeps
    its own output layer, e.g. a critic's fresh value head copied from an actor)."""
    have = dict(source.named_parameters())
    with torch.no_grad():
        for name, param in target.named_parameters():
            if keep_head and name == "output_layer.weight":
                continue
            if name not in have or have[name].shape != param.shape:
                raise InvalidArgument(
                    f"cannot copy weights: the source model has no parameter {name!r} shaped like "
                    f"{tuple(param.shape)}; copy between roles of the same model"
                )
            param.copy_(have[name])
