"""The `training` section: how generation and training overlap (sync, one_step_off, async), the staleness
bound and back-pressure, and its rules. Part of `JobConfig` (meshrl.scheduler.config)."""

from __future__ import annotations

from typing import Literal

import pydantic

from meshrl.common.config import StrictModel

Field = pydantic.Field


class TrainingSection(StrictModel):
    """How generation and training overlap (meshrl.scheduler.step.pacing.modes): `sync` runs each step's DAG in order;
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
