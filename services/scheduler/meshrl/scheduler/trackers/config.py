"""The `logging` section of a job config: which experiment trackers get the run's metrics, config
and plots (TensorBoard, Weights & Biases offline or online, MLflow), and where each writes.

Read by meshrl.scheduler.config (JobConfig.logging) and meshrl.scheduler.trackers.open_trackers.
Each backend is an optional extra of meshrl-scheduler; asking for one that is not installed fails
when the config is loaded, naming the extra to install.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

import pydantic

from meshrl.common.config import StrictModel

Backend = Literal["tensorboard", "wandb", "mlflow"]

# backend -> (the modules it imports, the extra that installs them)
REQUIREMENTS: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboardX",), "meshrl-scheduler[tensorboard]"),
    "wandb": (("wandb",), "meshrl-scheduler[wandb]"),
    "mlflow": (("mlflow", "sqlalchemy", "alembic"), "meshrl-scheduler[mlflow]"),
}


def missing_modules(backend: str) -> list[str]:
    modules, _ = REQUIREMENTS[backend]
    return [m for m in modules if importlib.util.find_spec(m) is None]


class LoggingSection(StrictModel):
    backends: list[Backend] = pydantic.Field(
        default_factory=list, description="experiment trackers that get every metric, the config and the plots"
    )
    project: str = pydantic.Field("meshrl", min_length=1, description="W&B project / MLflow experiment name")
    tensorboard_dir: str | None = pydantic.Field(None, description="event-file folder (default: RUN/tensorboard)")
    wandb_mode: Literal["offline", "online"] = pydantic.Field(
        "offline", description="offline writes RUN/wandb/offline-run-* (`wandb sync` uploads it later)"
    )
    wandb_dir: str | None = pydantic.Field(None, description="folder holding wandb/ (default: the run folder)")
    mlflow_tracking_uri: str | None = pydantic.Field(
        None, description="MLflow tracking URI (default: sqlite:///RUN/mlflow.db, artifacts in RUN/mlartifacts)"
    )

    @pydantic.field_validator("backends")
    @classmethod
    def _installed(cls, backends: list[str]) -> list[str]:
        if len(set(backends)) != len(backends):
            raise ValueError(f"{backends} names a backend twice; list each once")
        for backend in backends:
            missing = missing_modules(backend)
            if missing:
                raise ValueError(
                    f"backend {backend!r} needs {', '.join(missing)}, which is not installed; "
                    f"`pip install '{REQUIREMENTS[backend][1]}'` or drop it from logging.backends"
                )
        return backends
