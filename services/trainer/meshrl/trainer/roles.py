"""Per-role state of a trainer process and the result types of its operations.

Owned by `meshrl.trainer.core.TrainerCore`; read by `training` (train steps) and the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from meshrl.common.codec import Ragged
from meshrl.common.errors import InvalidArgument
from meshrl.trainer.hf_config import ModelSpec
from meshrl.trainer.optim import OptimizerConfig


class NonFiniteLoss(InvalidArgument):
    """A train step produced a NaN/inf loss or gradient; the model and optimizer were left unchanged."""


@dataclass
class RoleState:
    role: str
    model_path: str
    spec: ModelSpec
    model: torch.nn.Module
    dtype: str
    optimizer: torch.optim.Optimizer | None = None
    optimizer_config: OptimizerConfig | None = None
    train_steps: int = 0  # optimizer steps taken
    weight_version: int = 0  # last version published from this role
    names: dict[int, str] = field(default_factory=dict)  # id(param) -> megatron name

    @property
    def value_head(self) -> bool:
        return self.role == "critic"

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


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
