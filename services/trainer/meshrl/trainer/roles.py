"""Per-role state of a trainer process and the result types of its operations.

Owned by `meshrl.trainer.core.TrainerCore`; read by `training` (train steps) and the server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from meshrl.common.codec import Ragged
from meshrl.common.errors import InvalidArgument
from meshrl.trainer.hf_config import ModelSpec
from meshrl.trainer.optim_config import OptimizerConfig
from meshrl.trainer.parallel import Layout

VALUE_HEAD_ROLES = ("critic", "reward")  # roles whose output layer is the [1, hidden] head `score.weight`


class NonFiniteLoss(InvalidArgument):
    """A train step produced a NaN/inf loss or gradient; the model and optimizer were left unchanged."""


@dataclass
class RoleState:
    role: str
    model_path: str
    spec: ModelSpec
    model: torch.nn.Module
    dtype: str
    layout: Layout = field(default_factory=Layout)
    ddp: torch.nn.Module | None = None  # Megatron DistributedDataParallel around `model` (trainable roles)
    optimizer: object | None = None  # a megatron.core.optimizer.MegatronOptimizer (trainable roles)
    optimizer_config: OptimizerConfig | None = None
    train_steps: int = 0  # optimizer steps taken
    weight_version: int = 0  # last version published from this role
    names: dict[int, str] = field(default_factory=dict)  # id(param) -> megatron name (this rank's part)
    pad_token_id: int | None = None  # reward role: the id a sequence classifier pools past (reward_model.py)

    @property
    def runner(self) -> torch.nn.Module:
        """The module the schedules run: the DDP wrapper when there is one."""
        return self.ddp if self.ddp is not None else self.model

    @property
    def value_head(self) -> bool:
        return self.role in VALUE_HEAD_ROLES

    @property
    def num_parameters(self) -> int:
        """Parameters of the whole model (HF count), whatever this rank holds."""
        return sum(math.prod(s) for s in self.spec_shapes().values())

    def spec_shapes(self) -> dict[str, tuple[int, ...]]:
        from meshrl.trainer.hf_weights import VALUE_HEAD, hf_shapes

        shapes = hf_shapes(self.spec)
        if self.value_head:
            shapes.pop("lm_head.weight", None)
            shapes[VALUE_HEAD] = (1, self.spec.hidden_size)
        return shapes


@dataclass
class ComputeResult:
    values: Ragged  # float32 per response token: log-probs or critic values
    entropy: Ragged | None
    tokens: int  # response tokens scored (global)
    micro_batches: int  # on this rank


@dataclass
class TrainResult:
    metrics: dict[str, float]
    tokens: int
    optimizer_steps: int
    micro_batches: int = 0  # forward/backward passes on this rank, over all optimizer steps
    old_logprobs: Ragged | None = None  # pi_old of an 'in-train' pass (LossConfig.old_logprobs), else None
    step_losses: list[float] = field(default_factory=list)  # each optimizer step's loss, in order
