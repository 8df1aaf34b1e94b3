"""`JobConfig`: every section of a job (what `meshrl run` and SubmitJob take) and the rules that span sections
(effective loss defaults of the off-policy modes, the trainer group on Ray, what colocated placement needs)."""

from __future__ import annotations

import pydantic

from meshrl.common.config import StrictModel
from meshrl.common.errors import ConfigError
from meshrl.common.loss_config import ASYNC_IS_LEVEL, ASYNC_MIS_CAP, ASYNC_TIS_CAP
from meshrl.common.telemetry import TelemetryConfig
from meshrl.scheduler.config.algorithm import JOB_POLICY_LOSSES, AlgorithmSection
from meshrl.scheduler.config.job import CheckpointSection, DataSection, EvalSection, JobSection, ModelSection
from meshrl.scheduler.config.rollout import RolloutSection
from meshrl.scheduler.config.services import ServicesSection
from meshrl.scheduler.config.trainer import TrainerSection
from meshrl.scheduler.config.training import TrainingSection
from meshrl.scheduler.config.warmup import WarmupSection
from meshrl.scheduler.config.weights import WeightsSection
from meshrl.scheduler.trackers.config import LoggingSection

Field = pydantic.Field


class JobConfig(StrictModel):
    job: JobSection = Field(default_factory=JobSection)
    model: ModelSection
    data: DataSection
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    weights: WeightsSection = Field(default_factory=WeightsSection)
    warmup: WarmupSection = Field(default_factory=WarmupSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    services: ServicesSection = Field(default_factory=ServicesSection)
    telemetry: TelemetryConfig = Field(default_factory=lambda: TelemetryConfig(exporter="file"))
    logging: LoggingSection = Field(default_factory=LoggingSection)

    @pydantic.model_validator(mode="after")
    def _async_corrects_off_policy(self) -> JobConfig:
        """one_step_off and async train on samples of older weights: unless the loss says otherwise (either cap
        set; 0 turns it off), their off-policy correction is on, one weight per response unless is_level is set
        (LossConfig's docstring lists these defaults). With old_logprobs 'rollout' pi_old is the behaviour
        policy, so there is nothing to correct. The loss rules are LossConfig's, checked by LossSection; the
        actor's objective is a job's choice."""
        loss = self.algorithm.loss
        if loss.policy_loss not in (None, *JOB_POLICY_LOSSES):
            raise ConfigError(
                "algorithm.loss.policy_loss",
                loss.policy_loss,
                "is no RL objective of the actor",
                f"use one of {JOB_POLICY_LOSSES} (a supervised phase is the warm-up section)",
            )
        if self.training.mode != "sync" and loss.old_logprobs != "rollout":
            if loss.tis_cap is None and loss.mis_cap is None:
                loss.tis_cap, loss.mis_cap = ASYNC_TIS_CAP, ASYNC_MIS_CAP
            if loss.is_level is None:
                loss.is_level = ASYNC_IS_LEVEL
        return self

    @pydantic.model_validator(mode="after")
    def _trainer_group_on_ray(self) -> JobConfig:
        if self.trainer.launch == "group" and self.trainer.address is None:
            s = self.services
            if not s.use_ray or s.placement != "disaggregated":
                raise ConfigError(
                    "trainer.launch",
                    "group",
                    f"its ranks are Ray actors on their own bundles, but services.use_ray = {s.use_ray} and "
                    f"services.placement = {s.placement!r}",
                    "set services.use_ray: true and services.placement: disaggregated, or trainer.launch: local",
                )
        return self

    @pydantic.model_validator(mode="after")
    def _cpu_placement_of_launched_services(self) -> JobConfig:
        if self.services.cpu_placement is not None and self.trainer.launch == "group" and not self.trainer.address:
            raise ConfigError(
                "services.cpu_placement",
                self.services.cpu_placement.model_dump(exclude_none=True),
                "pins the trainer process this host launches, but trainer.launch = 'group' places its ranks as "
                "Ray actors on bundles of their own",
                "set trainer.launch: local, or drop services.cpu_placement",
            )
        return self

    @pydantic.model_validator(mode="after")
    def _colocated_fits(self) -> JobConfig:
        if self.services.placement == "colocated":
            problem = colocated_problem(self)
            if problem:
                raise ValueError(
                    f"services.placement = 'colocated' {problem}, or set services.placement: disaggregated"
                )
        return self


def colocated_problem(cfg: JobConfig) -> str:
    """Why a job cannot run colocated ('' when it can): the scheduler must launch the trainer and every
    replica itself on Ray, generation and training must take turns, and a replica that gave up its weights
    must be refilled with a complete version."""
    checks = [
        (not cfg.services.use_ray, "needs services.use_ray: true (the shared bundle is a Ray placement group)"),
        (cfg.trainer.address is not None, "needs a launched trainer; unset trainer.address"),
        (
            bool(cfg.rollout.addresses) or cfg.rollout.registry.redis_url is not None,
            "needs launched replicas only; empty rollout.addresses and unset rollout.registry.redis_url",
        ),
        (cfg.rollout.replicas < 1, "needs rollout.replicas >= 1"),
        (
            cfg.training.mode != "sync",
            f"takes turns on the device, so training.mode must be 'sync' "
            f"(got {cfg.training.mode!r}); set training.mode: sync",
        ),
        (cfg.weights.delta, "refills released weights with complete versions; set weights.delta: false"),
        (
            bool(cfg.warmup.eval_accuracy_every),
            "gives the device to the trainer for the whole warm-up, so it "
            "cannot evaluate accuracy during it; set warmup.eval_accuracy_every: 0",
        ),
    ]
    return next((msg for bad, msg in checks if bad), "")
