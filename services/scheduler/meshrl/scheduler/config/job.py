"""The job's own sections: `job` (name, steps, seed, run root, restarts, allowed modules), `model`, `data`,
`eval` and `checkpoint` (their intervals). Part of `JobConfig` (meshrl.scheduler.config)."""

from __future__ import annotations

from typing import Literal

import pydantic

from meshrl.common.config import StrictModel

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


class EvalSection(StrictModel):
    every: int = Field(5, ge=0, description="evaluate every K steps (0: only at the start and the end)")
    max_prompts: int = Field(128, ge=1)
    max_tokens: int | None = None


class CheckpointSection(StrictModel):
    every: int = Field(0, ge=0, description="save every K steps (0: only at the end)")
