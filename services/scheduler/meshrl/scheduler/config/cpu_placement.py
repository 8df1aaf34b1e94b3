"""`services.cpu_placement`: disaggregated placement on one host's CPUs, so that the trainer and the rollout
replicas the job launches never share a core (each its own cores and as many torch threads). Either the
proportions of the host's cores each side gets (`trainer_share`, `rollout_share`) or the cores themselves
(`trainer_cores`, `rollout_cores`). `others` says whose cores the rest of the job's work shares: the
scheduler's step loop (rewards, the producer, hand-offs) and the data buffer. Part of `ServicesSection`; the sets
are worked out on the launching host by meshrl.scheduler.launch.cpu_placement, which also checks that the cores
exist there.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from meshrl.common.config import StrictModel

Field = pydantic.Field


class CpuPlacement(StrictModel):
    trainer_share: float = Field(
        1.0, gt=0, description="the trainer's proportion of the host's cores (against rollout_share)"
    )
    rollout_share: float = Field(
        1.0, gt=0, description="the rollout replicas' proportion of the host's cores, split among the replicas"
    )
    trainer_cores: list[int] | None = Field(
        None, description="the trainer's cores by number (with rollout_cores, instead of the shares)"
    )
    rollout_cores: list[int] | None = Field(
        None, description="the replicas' cores by number (with trainer_cores, instead of the shares)"
    )
    others: Literal["rollout", "trainer", "any"] = Field(
        "rollout",
        description="whose cores the scheduler's work for the job (step loop, rewards, producer) and the data "
        "buffer run on: the rollout replicas' (default: generation leaves them idle while the trainer trains), "
        "the trainer's, or any core",
    )

    @pydantic.model_validator(mode="after")
    def _one_way_of_saying_it(self) -> CpuPlacement:
        explicit = (self.trainer_cores is not None, self.rollout_cores is not None)
        if any(explicit) and not all(explicit):
            raise ValueError(
                "services.cpu_placement names the cores of one side only: give both trainer_cores and "
                "rollout_cores, or neither (then trainer_share and rollout_share split the host's cores)"
            )
        if all(explicit) and {"trainer_share", "rollout_share"} & self.model_fields_set:
            raise ValueError(
                "services.cpu_placement gives both shares and core lists: keep trainer_cores / rollout_cores, "
                "or drop them and keep trainer_share / rollout_share"
            )
        if all(explicit):
            for side, cores in (("trainer_cores", self.trainer_cores), ("rollout_cores", self.rollout_cores)):
                if not cores:
                    raise ValueError(f"services.cpu_placement.{side} is empty: name at least one core, e.g. [0]")
                if min(cores) < 0 or len(set(cores)) != len(cores):
                    raise ValueError(
                        f"services.cpu_placement.{side} = {cores}: cores are distinct numbers >= 0 (e.g. [0, 1])"
                    )
            shared = sorted(set(self.trainer_cores) & set(self.rollout_cores))
            if shared:
                raise ValueError(
                    f"services.cpu_placement: cores {shared} are in both trainer_cores and rollout_cores; the "
                    "point is that the two sides never share a core: give each core to one side only"
                )
        return self
