"""The trainer's parallel layout as launched, checked against the workflow's trainer nodes.

The job config's `trainer.tensor_parallel` / `trainer.pipeline_parallel` are what the trainer's ranks start
with (`launch.services`); a trainer node (actor, reference, critic) that sets `config.tensor_parallel_size` or
`config.pipeline_parallel_size` must agree with them, so that `meshrl plan` (which reads the nodes) shows
what runs; nodes that set nothing are given the job config's layout. Called by `meshrl.scheduler.step.job.runner`
before any service starts and by `meshrl plan` (`planning.plan_cli`) when it is given the job config.
"""

from __future__ import annotations

from meshrl.common.errors import ConfigError
from meshrl.scheduler.config import TrainerSection
from meshrl.scheduler.workflow import compute_catalog as cat

TRAINER_ROLES = ("ACTOR", "REFERENCE", "CRITIC")


def check_trainer_layout(workflow, trainer: TrainerSection) -> None:
    """Raises ConfigError naming the node whose layout differs from the job config's trainer section."""
    launched = {
        cat.CONFIG_TP: ("tensor_parallel", trainer.tensor_parallel),
        cat.CONFIG_PP: ("pipeline_parallel", trainer.pipeline_parallel),
    }
    for node in workflow.nodes:
        if getattr(node.node_role, "value", node.node_role) not in TRAINER_ROLES:
            continue
        for key, (field, value) in launched.items():
            if key in node.config and int(node.config[key]) != value:
                raise ConfigError(
                    f"trainer.{field}",
                    value,
                    f"workflow node '{node.node_id}' sets config.{key} = {node.config[key]}, but the trainer is "
                    f"launched with {field} = {value}",
                    f"set trainer.{field}={node.config[key]} in the job config, or change or drop the node's {key}",
                )


def apply_trainer_layout(workflow, trainer: TrainerSection) -> None:
    """Checks the trainer nodes (see `check_trainer_layout`), then gives those that set no layout the job's."""
    check_trainer_layout(workflow, trainer)
    for node in workflow.nodes:
        if getattr(node.node_role, "value", node.node_role) in TRAINER_ROLES:
            node.config.setdefault(cat.CONFIG_TP, trainer.tensor_parallel)
            node.config.setdefault(cat.CONFIG_PP, trainer.pipeline_parallel)


def trainer_section(config: dict) -> TrainerSection:
    """The layout fields of a job config's `trainer` section (a plain dict, as `meshrl plan` reads it)."""
    fields = ("tensor_parallel", "pipeline_parallel", "data_parallel")
    return TrainerSection(**{k: v for k, v in (config.get("trainer") or {}).items() if k in fields})
