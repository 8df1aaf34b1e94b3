"""Experiment trackers of a job: the run's metrics (every step and every evaluation), its config and
its plots go to the backends named in `logging.backends` (TensorBoard, W&B, MLflow) besides the run
folder's own JSONL. The job runner opens them at the start (`open_trackers`) and calls
`Trackers.log` / `Trackers.finish`.
"""

from __future__ import annotations

from pathlib import Path

from meshrl.scheduler.trackers.base import Tracker, Trackers
from meshrl.scheduler.trackers.config import LoggingSection


def _open(backend: str, section: LoggingSection, root: Path, name: str, config: dict) -> Tracker:
    if backend == "tensorboard":
        from meshrl.scheduler.trackers.tensorboard import TensorBoardTracker

        return TensorBoardTracker(Path(section.tensorboard_dir or root / "tensorboard"), config)
    if backend == "wandb":
        from meshrl.scheduler.trackers.wandb_run import WandbTracker

        return WandbTracker(Path(section.wandb_dir or root), section.project, section.wandb_mode, name, config)
    from meshrl.scheduler.trackers.mlflow_run import MlflowTracker

    if section.mlflow_tracking_uri:
        return MlflowTracker(section.mlflow_tracking_uri, section.project, name, config)
    local = f"sqlite:///{root / 'mlflow.db'}"
    return MlflowTracker(local, section.project, name, config, artifacts=root / "mlartifacts")


def open_trackers(section: LoggingSection, root: Path, name: str, config: dict) -> Trackers:
    """Opens every backend of `section` for the run folder `root`; closes the opened ones if one fails."""
    opened = Trackers()
    try:
        for backend in section.backends:
            opened.trackers.append(_open(backend, section, Path(root), name, config))
    except Exception:
        opened.finish(0, [])
        raise
    return opened


__all__ = ["LoggingSection", "Tracker", "Trackers", "open_trackers"]
