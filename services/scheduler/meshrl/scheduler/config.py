"""Typed configuration of a job (what `meshrl run` and SubmitJob take) and of the scheduler service.

Sections: job, model, data, rollout, trainer, algorithm, weights, warmup, eval,
checkpoint, training (sync / one-step-off / async), services, telemetry, logging (experiment trackers). Every field has a default that runs on a CPU; a
workflow's nodes read their settings from here through `${...}` references.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from meshrl.common.comm_backend import CommBackend
from meshrl.common.config import StrictModel
from meshrl.common.errors import ConfigError
from meshrl.common.grpc_channel import ChannelConfig
from meshrl.common.grpc_server import ServerConfig
from meshrl.common.loss_config import ASYNC_MIS_CAP, ASYNC_TIS_CAP, LossSection
from meshrl.common.telemetry import TelemetryConfig
from meshrl.scheduler.job_access import JobAccess
from meshrl.scheduler.job_permissions import JobPermissions
from meshrl.scheduler.trackers.config import LoggingSection

Field = pydantic.Field


class JobSection(StrictModel):
    name: str = Field("job", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="a short name made of letters, digits, _.-")
    steps: int = Field(10, ge=0, description="RL steps to run")
    seed: int = 0
    run_root: str = Field("runs", description="folder that holds one folder per run")
    max_restarts: int = Field(
        3, ge=0, description="times a dead service restarts the job's services and resumes it (0: fail at once)"
    )
    restart_backoff_seconds: float = Field(2.0, ge=0, description="pause before such a restart")
    allowed_modules: list[str] = Field(
        default_factory=lambda: ["meshrl"],
        description="module prefixes that executable_refs, rewards and data generators may come from "
        "(under the scheduler service: only a narrowing of the scheduler's own allowed_modules)",
    )


class ModelSection(StrictModel):
    path: str = Field(description="Hugging Face model directory (config.json, safetensors, tokenizer)")
    build: dict[str, object] | None = Field(
        None, description="when `path` does not exist, build a small random model with these builder options"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class DataSection(StrictModel):
    train: str = Field(description="jsonl / parquet file or Hugging Face `datasets` folder of training prompts")
    eval: str | None = Field(None, description="held-out prompts, evaluated at step 0 and every eval.every steps")
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    response_key: str | None = Field(None, description="supervised target for warm-up (default: the answer)")
    generator: str | None = Field(None, description="package.module:function(out_dir, seed) writing missing files")
    prompts_per_step: int = Field(8, ge=1)
    shuffle_seed: int = 0
    apply_chat_template: bool = True
    system_prompt: str | None = None


class FleetRegistrySection(StrictModel):
    """Replicas deployed on their own register here; the job's fleet follows it (joins, drains, deaths)."""

    redis_url: str | None = Field(None, description="redis://host:port/db of the replica registry; unset = none")
    namespace: str = Field("meshrl", description="the replicas' registry.namespace")
    join_timeout_seconds: float = Field(120.0, gt=0, description="a newcomer's refit + verification deadline")


class RolloutSection(StrictModel):
    replicas: int = Field(1, ge=0, description="replicas launched by the scheduler (0: only `addresses`)")
    engine: Literal["transformers", "sglang", "vllm"] = "transformers"
    n: int = Field(4, ge=1, description="samples per prompt (a group)")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(32, ge=1)
    addresses: list[str] = Field(default_factory=list, description="replicas deployed independently (host:port)")
    request_timeout_seconds: float = Field(600.0, gt=0)
    max_batch_size: int = Field(64, ge=1)
    gpus_per_replica: float = Field(0.0, ge=0, description="GPUs in each replica's placement bundle")
    service_overrides: list[str] = Field(
        default_factory=list,
        description="extra `key=value` settings of the launched rollout services, e.g. engine.sglang.extra_args.tp=2",
    )
    registry: FleetRegistrySection = Field(default_factory=lambda: FleetRegistrySection())


TRAINER_DEFAULT = "unset: the trainer's default (meshrl.trainer.optim.OptimizerConfig)"
JOB_POLICY_LOSSES = ("ppo", "gspo")  # the actor's RL objectives (sft is the warm-up's, value the critic's)


class AlgorithmSection(StrictModel):
    advantage: Literal["grpo", "grpo_no_std", "rloo", "reinforce_pp", "gae"] = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    loss: LossSection = Field(default_factory=LossSection)
    reward: str = Field("exact_match", description="built-in reward name or package.module:function")
    reward_workers: int = Field(
        0, ge=0, description="worker processes that score rewards apart from the scheduler, one call per group, "
        "with a timeout and a crash boundary (0: in the scheduler's process, no timeout)",
    )  # fmt: skip
    reward_timeout_seconds: float = Field(60.0, gt=0, description="per-group reward call limit (reward_workers > 0)")
    reward_retries: int = Field(1, ge=0, description="retries of a group whose reward failed; then it scores 0")
    environment_workers: int = Field(2, ge=1, description="worker processes running a ROLLOUT node's environment")
    environment_timeout_seconds: float = Field(30.0, gt=0, description="limit of one environment reset/step call")


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


class WeightsSection(StrictModel):
    transport: Literal["disk", "distributed"] = "disk"
    keep_last: int = Field(2, ge=0, description="disk versions kept (0 = all)")
    bucket_bytes: int = Field(512 << 20, ge=1 << 20)
    pause_mode: Literal["abort", "in_place"] = "in_place"
    flush_cache: Literal["every_update", "never"] = "every_update"
    timeout_seconds: float = Field(120.0, gt=0)
    verify_checksums: bool = True
    group_address: str | None = Field(
        None, description="distributed: rendezvous host of the weight group (default: the trainer's host)"
    )
    group_port: int = Field(
        0, ge=0, le=65535, description="distributed: rendezvous port on the trainer's host (0: a free one)"
    )
    backend: CommBackend = Field(
        CommBackend.AUTO,
        description="distributed: the weight group's backend; auto = nccl when the trainer and every replica hold "
        "CUDA devices (their status says), else gloo; nccl with a CPU member is refused naming this field",
    )
    protocol: Literal["auto", "meshrl", "engine"] = Field(
        "auto",
        description="distributed: engine = SGLang/vLLM workers join the group and receive natively; meshrl = each "
        "replica receives as one rank (SGLang/vLLM adapters relay a folder); auto = engine when every replica "
        "is an SGLang or vLLM server",
    )
    delta: bool = Field(
        False,
        description="after a complete version, publish only the bits that changed, on disk or over the weight "
        "group (protocol meshrl; the engines' own wire takes complete versions); the trainer keeps one more copy "
        "of the weights, and a replica that missed the base is refitted with a complete version. Off by "
        "default: bench/weights measured 2-8% of the bytes at lr 1e-6..1e-5 but more publication time where "
        "bytes are cheap (encoding is CPU-bound); turn it on when bytes cross a slow link",
    )
    max_delta_fraction: float = Field(
        0.5, gt=0, le=1, description="delta: above this share of a complete version, publish it complete"
    )


class WarmupSection(StrictModel):
    """Supervised warm-up on (prompt, response) pairs before RL (a job phase, run once; meshrl.scheduler.step.warmup).

    The defaults are what bench/vs_trl measured against TRL's SFTTrainer: lr decayed linearly to min_lr over
    the phase and a fresh optimizer for RL."""

    steps: int = Field(0, ge=0, description="optimizer steps (0 with epochs 0: no warm-up)")
    epochs: float = Field(0.0, ge=0, description="passes over data.train instead of steps (set one of the two)")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-3, gt=0, description="peak learning rate")
    schedule: Literal["constant", "linear", "cosine"] = Field("linear", description="decay after the ramp")
    warmup_ratio: float = Field(0.0, ge=0, le=1, description="share of the steps with a linear lr ramp")
    min_lr: float = Field(0.0, ge=0, description="the rate the decay ends at")
    eval_every: int = Field(0, ge=0, description="held-out loss every K steps (always at the end)")
    eval_accuracy_every: int = Field(
        0, ge=0, description="held-out accuracy every K steps (0: only after the warm-up, as RL's step 0): the "
        "actor's weights are published to the replicas and the job's greedy evaluation (`eval`) runs; its time is "
        "left out of the warm-up's seconds",
    )  # fmt: skip
    handover: Literal["fresh", "keep"] = Field(
        "fresh", description="fresh: RL starts with a new optimizer; keep: RL continues the warm-up's Adam state"
    )
    steps_per_call: int = Field(
        8, ge=1, description="optimizer steps per trainer call: their batches travel in one buffer put and one "
        "TrainStep that gives each step its own learning rate, so a small step does not pay a call's fixed cost "
        "each time; the same steps, rates and curve as one call per step. Calls end where a held-out evaluation "
        "is due",
    )  # fmt: skip

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> WarmupSection:
        if self.steps and self.epochs:
            raise ValueError(f"warmup.steps = {self.steps} and warmup.epochs = {self.epochs}: set only one of them")
        if self.min_lr > self.lr:
            raise ValueError(f"warmup.min_lr = {self.min_lr} is above warmup.lr = {self.lr}; use a value <= lr")
        return self


class EvalSection(StrictModel):
    every: int = Field(5, ge=0, description="evaluate every K steps (0: only at the start and the end)")
    max_prompts: int = Field(128, ge=1)
    max_tokens: int | None = None


class TrainingSection(StrictModel):
    """How generation and training overlap (meshrl.scheduler.step.modes): `sync` runs each step's DAG in order;
    `one_step_off` generates step k+1 while step k trains (samples one weight version old); `async` keeps
    generating up to `max_staleness` versions ahead of the trainer."""

    mode: Literal["sync", "one_step_off", "async"] = "sync"
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="eta: versions a consumed sample may lag the trainer (sync 0, one_step_off 1; async: set it)",
    )
    stream_groups: int = Field(
        0, ge=0, description="back-pressure: most unconsumed groups in the sample stream (0: (eta + 1) steps' worth)"
    )
    stale_policy: Literal["drop", "regenerate"] = Field(
        "drop",
        description="a group older than eta: 'drop' it (counted), or 'regenerate' (its prompt goes back to the "
        "data loader and is generated again on current weights; counted)",
    )
    split_threads: bool = Field(
        True,
        description="one_step_off / async, a CPU trainer the job launches: true gives it the cores its replicas "
        "(one torch thread each) leave, at least one, so generation and training do not oversubscribe the host; "
        "false: every core, as in sync. trainer.service_overrides torch_threads=N wins",
    )

    @pydantic.model_validator(mode="after")
    def _staleness_fits_mode(self) -> TrainingSection:
        fixed = {"sync": 0, "one_step_off": 1}.get(self.mode)
        if fixed is not None and self.max_staleness not in (None, fixed):
            raise ValueError(
                f"training.max_staleness = {self.max_staleness} does not fit training.mode = {self.mode!r} "
                f"(it is {fixed} there); use mode 'async' for another bound or leave max_staleness unset"
            )
        if self.mode == "sync" and self.stale_policy != "drop":
            raise ValueError(
                f"training.stale_policy = {self.stale_policy!r} does not fit training.mode = 'sync' (no sample is "
                "ever stale there); use mode 'one_step_off' or 'async', or leave stale_policy unset"
            )
        if self.mode == "async" and self.max_staleness is None:
            raise ValueError("training.max_staleness is unset; mode 'async' needs a bound, e.g. 1 or 2")
        return self

    @property
    def staleness(self) -> int:
        return {"sync": 0, "one_step_off": 1}.get(self.mode, self.max_staleness or 0)


class CheckpointSection(StrictModel):
    every: int = Field(0, ge=0, description="save every K steps (0: only at the end)")


class PeerChannels(StrictModel):
    """How the scheduler reaches each peer: TLS (ca_file, cert_file + key_file for mTLS) and auth.token_file.
    Addresses stay where they were (services.databuffer, trainer.address, rollout.addresses / registry);
    `rollout` applies to every replica."""

    databuffer: ChannelConfig = Field(default_factory=ChannelConfig)
    trainer: ChannelConfig = Field(default_factory=ChannelConfig)
    rollout: ChannelConfig = Field(default_factory=ChannelConfig)

    @pydantic.model_validator(mode="after")
    def _no_rollout_address(self) -> PeerChannels:
        if self.rollout.address:
            raise ValueError("services.channels.rollout.address: replicas come from rollout.addresses or the registry")
        return self


class ServicesSection(StrictModel):
    databuffer: str | None = Field(None, description="address of an independent data buffer (else launched)")
    redis_url: str | None = Field(None, description="Redis for the launched data buffer (else embedded)")
    ray_address: str | None = Field(None, description="an existing Ray cluster (else a local one)")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK"] = "PACK"
    placement: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description="colocated: the trainer and the replicas share one Ray bundle (its devices) and take turns "
        "(meshrl.scheduler.step.colocate); disaggregated: each on its own bundle",
    )
    use_ray: bool = Field(True, description="place launched services as Ray actors (else plain processes)")
    start_timeout_seconds: float = Field(180.0, gt=0)
    channels: PeerChannels = Field(default_factory=PeerChannels)


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
        set; 0 turns it off), their off-policy correction is on (LossConfig's docstring lists these defaults).
        With old_logprobs 'rollout' pi_old is the behaviour policy, so there is nothing to correct. The loss
        rules are LossConfig's, checked by LossSection; the actor's objective is a job's choice."""
        loss = self.algorithm.loss
        if loss.policy_loss not in (None, *JOB_POLICY_LOSSES):
            raise ConfigError(
                "algorithm.loss.policy_loss",
                loss.policy_loss,
                "is no RL objective of the actor",
                f"use one of {JOB_POLICY_LOSSES} (a supervised phase is the warm-up section)",
            )
        caps_unset = loss.tis_cap is None and loss.mis_cap is None
        if self.training.mode != "sync" and loss.old_logprobs != "rollout" and caps_unset:
            loss.tis_cap, loss.mis_cap = ASYNC_TIS_CAP, ASYNC_MIS_CAP
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
        (bool(cfg.rollout.addresses) or cfg.rollout.registry.redis_url is not None,
         "needs launched replicas only; empty rollout.addresses and unset rollout.registry.redis_url"),
        (cfg.rollout.replicas < 1, "needs rollout.replicas >= 1"),
        (cfg.training.mode != "sync", f"takes turns on the device, so training.mode must be 'sync' "
         f"(got {cfg.training.mode!r}); set training.mode: sync"),
        (cfg.weights.delta, "refills released weights with complete versions; set weights.delta: false"),
        (bool(cfg.warmup.eval_accuracy_every), "gives the device to the trainer for the whole warm-up, so it "
         "cannot evaluate accuracy during it; set warmup.eval_accuracy_every: 0"),
    ]  # fmt: skip
    return next((msg for bad, msg in checks if bad), "")


class SchedulerServiceConfig(StrictModel):
    """`python -m meshrl.scheduler`: the job API server."""

    server: ServerConfig = Field(default_factory=lambda: ServerConfig(port=50050))
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    run_root: str = Field("runs", description="every run folder lies under it; a job may name a sub-folder only")
    max_concurrent_jobs: int = Field(1, ge=1)
    keep_finished_jobs: int = Field(
        100,
        ge=0,
        description="ended jobs kept in memory (event logs) for GetJob / WatchJob; older ones are "
        "forgotten, their run folders stay",
    )
    recover_jobs: bool = Field(True, description="on start, resume the jobs that were running in run_root")
    allowed_modules: list[str] = Field(
        default_factory=lambda: ["meshrl"],
        description="the operator's allow-list: module prefixes a submitted job's executable_refs, rewards and "
        "data generators may come from (a job's job.allowed_modules may only narrow it; '*' allows any)",
    )
    job_permissions: JobPermissions = Field(
        default_factory=JobPermissions,
        description="infrastructure fields a submitted job may set (Ray cluster, peer addresses, paths outside "
        "the run root, data generators, tracking URIs, further service overrides); empty lists allow none",
    )
    channels: PeerChannels = Field(
        default_factory=PeerChannels,
        description="TLS and tokens the scheduler uses to reach every job's peers; a job may not set its own",
    )
    job_access: JobAccess = Field(
        default_factory=JobAccess,
        description="who may act on which job: named submitter tokens (each an identity, like a client "
        "certificate's common name) act only on their own jobs; job_access.admins on every job",
    )
