"""MLflow backend: one MLflow run per job in the experiment `logging.project`, on
logging.mlflow_tracking_uri (default: a local store in the run folder, sqlite:///RUN/mlflow.db with
artifacts in RUN/mlartifacts -- MLflow 3 refuses its old plain-file store; `mlflow ui
--backend-store-uri sqlite:///RUN/mlflow.db` shows it). Metrics per step, the config as parameters
and as an artifact, the plots as artifacts. Uses MlflowClient only (no global active run), so jobs
in one scheduler process do not mix. Opened by trackers.open_trackers.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import yaml

from meshrl.scheduler.trackers.base import flatten

MAX_PARAM_CHARS = 6000  # MLflow's limit on one parameter value


class MlflowTracker:
    name = "mlflow"

    def __init__(
        self, tracking_uri: str, experiment: str, run_name: str, config: dict, artifacts: Path | None = None
    ) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            location = artifacts.as_uri() if artifacts is not None else None
            experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        params = [Param(k, v[:MAX_PARAM_CHARS]) for k, v in flatten(config).items()]
        for start in range(0, len(params), 100):  # log_batch takes at most 100 params a call
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            self.client.log_artifact(self.run_id, str(path))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, value, now, step) for key, value in metrics.items()]
        for start in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        for path in images.values():
            self.client.log_artifact(self.run_id, str(path), artifact_path="plots")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
