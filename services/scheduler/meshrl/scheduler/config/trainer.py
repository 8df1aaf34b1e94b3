"""The `trainer` section: a launched or given trainer, its layout and its optimizers (sent to the trainer,
which owns each optimizer setting's default). Part of `JobConfig` (meshrl.scheduler.config)."""

from __future__ import annotations

from typing import Literal

import pydantic

from meshrl.common.config import StrictModel

Field = pydantic.Field

TRAINER_DEFAULT = "unset: the trainer's default (meshrl.trainer.optim.OptimizerConfig)"


class OptimSection(StrictModel):
    """A trainable role's optimizer, sent as `meshrl.trainer.v1.OptimizerConfig`; the trainer owns each
    setting and its default (`meshrl.trainer.optim.OptimizerConfig`); a field left out is left unset."""

    lr: float | None = Field(None, gt=0, description="peak learning rate; " + TRAINER_DEFAULT)
    min_lr: float | None = Field(None, ge=0)
    weight_decay: float | None = Field(None, ge=0)
    adam_beta1: float | None = Field(None, ge=0, lt=1)
    adam_beta2: float | None = Field(None, ge=0, lt=1)
    adam_eps: float | None = Field(None, gt=0)
    clip_grad: float | None = Field(None, ge=0, description="max global grad norm; 0 = no clipping")
    warmup_steps: int | None = Field(None, ge=0)
    decay_steps: int | None = Field(None, ge=0)
    decay_style: Literal["constant", "linear", "cosine"] | None = None
    name: Literal["adam", "sgd"] | None = Field(None, description="adam (AdamW) or sgd; " + TRAINER_DEFAULT)
    distributed: bool | None = Field(None, description="Megatron's distributed optimizer (adam only)")


class TrainerSection(StrictModel):
    address: str | None = Field(None, description="a trainer deployed independently (host:port)")
    optimizer: OptimSection = Field(default_factory=OptimSection)
    critic_optimizer: OptimSection = Field(default_factory=OptimSection)
    micro_batch_tokens: int = Field(4096, ge=16)
    mini_batches: int = Field(1, ge=1)
    gradient_checkpointing: bool = Field(False, description="recompute layer activations in backward (less memory)")
    data_parallel: int = Field(1, ge=1, description="data-parallel replicas of every trainer model")
    tensor_parallel: int = Field(1, ge=1, description="trainer tensor parallelism (Megatron TP; must divide heads)")
    pipeline_parallel: int = Field(1, ge=1, description="trainer pipeline stages (Megatron PP; must divide layers)")
    gpus: float = Field(
        0.0, ge=0, description="GPUs in the trainer's placement bundle: one per rank = DP x TP x PP (0 on CPUs)"
    )
    service_overrides: list[str] = Field(
        default_factory=list, description="extra `key=value` settings of the launched trainer service"
    )
    request_timeout_seconds: float = Field(900.0, gt=0)
    launch: Literal["local", "group"] = Field(
        "local",
        description="local: one bundle, ranks 1..N-1 child processes of rank 0; group: every rank a Ray actor on "
        "its own bundle, on the node the job's plan gives it (meshrl.scheduler.launch.trainer_group; needs "
        "services.use_ray and services.placement: disaggregated)",
    )
