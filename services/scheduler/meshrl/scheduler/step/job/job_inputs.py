"""What a job does and reads before its services start: the trainer layout applied to the workflow, paths made
absolute, a missing small model built and missing data generated (`prepare_job`); then the data, the prompt
encoder and sampler and the reward (`read_job_inputs`). Called by `JobRunner` and `AgentJob`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.launch.trainer_layout import apply_trainer_layout
from meshrl.scheduler.step.job.colocate import check_colocated_workflow
from meshrl.scheduler.step.prompts.data import PromptEncoder, PromptSampler, load_records
from meshrl.scheduler.step.scoring.rewards import resolve_reward
from meshrl.scheduler.workflow import resolve_executable


class JobInputs(NamedTuple):
    """What a job reads before its services start: the data, the prompt encoder and sampler, the reward."""

    records: list
    eval_records: list
    encoder: PromptEncoder
    sampler: PromptSampler
    reward_fn: Any


def prepare_job(workflow, cfg: JobConfig, log: Callable[[str], None]) -> None:
    """Checks the workflow against the placement, makes the model and data paths absolute (services, Ray actors
    included, may run in another working directory), and builds or generates what `model.build` and
    `data.generator` say when the files are missing."""
    apply_trainer_layout(workflow, cfg.trainer)
    if cfg.services.placement == "colocated":
        check_colocated_workflow(workflow.nodes)
    cfg.model.path = str(Path(cfg.model.path).resolve())
    for field in ("train", "eval"):
        if getattr(cfg.data, field):
            setattr(cfg.data, field, str(Path(getattr(cfg.data, field)).resolve()))
    model = Path(cfg.model.path)
    if not (model / "config.json").exists():
        if cfg.model.build is None:
            raise InvalidArgument(f"model.path {model} has no config.json; point it at a Hugging Face folder")
        args = [a for k, v in cfg.model.build.items() for a in (f"--{k.replace('_', '-')}", str(v))]
        log(f"building a small model in {model}")
        subprocess.run([sys.executable, "-m", "meshrl.trainer.model_builder", str(model), *args], check=True)
    d = cfg.data
    missing = [p for p in (d.train, d.eval) if p and not Path(p).exists()]
    if missing:
        if not d.generator:
            raise InvalidArgument(f"data files {missing} do not exist and data.generator is not set")
        resolve_executable(d.generator, cfg.job.allowed_modules, "data.generator")(
            str(Path(d.train).parent), cfg.job.seed
        )


def read_job_inputs(cfg: JobConfig) -> JobInputs:
    """The data, prompt encoder and sampler, and reward a job reads before its services start."""
    d = cfg.data
    records = load_records(d.train, d.prompt_key, d.answer_key, d.response_key)
    eval_records = load_records(d.eval, d.prompt_key, d.answer_key)[: cfg.eval.max_prompts] if d.eval else []
    return JobInputs(
        records,
        eval_records,
        PromptEncoder(cfg.model.path, d.apply_chat_template, d.system_prompt),
        PromptSampler(records, d.shuffle_seed),
        resolve_reward(cfg.algorithm.reward, cfg.job.allowed_modules),
    )
