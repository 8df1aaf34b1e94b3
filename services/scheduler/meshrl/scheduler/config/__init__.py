"""Typed configuration of a job (what `meshrl run` and SubmitJob take) and of the scheduler service, one module
per section: `job` (job, model, data, eval, checkpoint), `rollout`, `trainer`, `algorithm`, `weights`, `warmup`,
`training` (sync / one-step-off / async), `services`; `job_config.JobConfig` holds them with telemetry and
logging (experiment trackers) and checks the rules that span sections; `service_config.SchedulerServiceConfig`
is the job API server's own. Every field has a default that runs on a CPU; a workflow's nodes read their
settings from here through `${...}` references. Callers import every name from this package.
"""

from __future__ import annotations

from meshrl.common.loss_config import ASYNC_IS_LEVEL, ASYNC_MIS_CAP, ASYNC_TIS_CAP, LossSection
from meshrl.scheduler.config.algorithm import JOB_POLICY_LOSSES, AlgorithmSection
from meshrl.scheduler.config.job import CheckpointSection, DataSection, EvalSection, JobSection, ModelSection
from meshrl.scheduler.config.job_config import JobConfig, colocated_problem
from meshrl.scheduler.config.rollout import FleetRegistrySection, RolloutSection
from meshrl.scheduler.config.service_config import SchedulerServiceConfig
from meshrl.scheduler.config.services import PeerChannels, ServicesSection
from meshrl.scheduler.config.trainer import TRAINER_DEFAULT, OptimSection, TrainerSection
from meshrl.scheduler.config.training import TrainingSection
from meshrl.scheduler.config.warmup import WarmupSection
from meshrl.scheduler.config.weights import WeightsSection

__all__ = [
    "ASYNC_IS_LEVEL",
    "ASYNC_MIS_CAP",
    "ASYNC_TIS_CAP",
    "JOB_POLICY_LOSSES",
    "TRAINER_DEFAULT",
    "AlgorithmSection",
    "CheckpointSection",
    "DataSection",
    "EvalSection",
    "FleetRegistrySection",
    "JobConfig",
    "JobSection",
    "LossSection",
    "ModelSection",
    "OptimSection",
    "PeerChannels",
    "RolloutSection",
    "SchedulerServiceConfig",
    "ServicesSection",
    "TrainerSection",
    "TrainingSection",
    "WarmupSection",
    "WeightsSection",
    "colocated_problem",
]
