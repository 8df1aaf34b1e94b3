"""Each experiment tracker backend (logging.backends) got what the two-step job recorded: every
step's and every evaluation's metrics with their steps, the config and the plots, read back from
what it wrote (TensorBoard event files, the W&B offline run, the MLflow store) and compared with
the run folder's metrics.jsonl / eval.jsonl."""

from __future__ import annotations

from pathlib import Path

import pytest
from _wandb_log import read_run

from meshrl.scheduler.rundir import RunDir

PLOTS = {"plots/curves", "plots/step_times"}


def _recorded(run_dir: Path) -> dict[str, dict[int, float]]:
    """metric -> {step: value} from the run folder's own JSONL (the reference)."""
    run = RunDir(run_dir)
    out: dict[str, dict[int, float]] = {}
    for record in run.read_jsonl(run.metrics_file) + run.read_jsonl(run.eval_file):
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float):
                out.setdefault(key, {})[record["step"]] = float(value)
    return out


@pytest.fixture(scope="module")
def recorded(observed):
    values = _recorded(observed["run_dir"])
    assert sorted(values["reward/mean"]) == [1, 2], "two training steps"
    assert sorted(values["eval/accuracy"]) == [0, 1, 2], "evaluations at steps 0, 1 and the end"
    return values


def _assert_same(got: dict[str, dict[int, float]], want: dict[str, dict[int, float]], rel: float = 1e-6):
    for key in ("reward/mean", "eval/accuracy", "time/step", "weights/version"):
        assert got.get(key) == pytest.approx(want[key], rel=rel), key


def test_tensorboard_event_files_hold_the_metrics_config_and_plots(observed, recorded):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(observed["run_dir"] / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    got = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in tags["scalars"]}
    _assert_same(got, recorded, rel=1e-5)  # event files store float32
    assert PLOTS <= set(tags["images"])
    assert any(tag.startswith("config") for tag in tags["tensors"]), tags["tensors"]


def test_wandb_offline_run_holds_the_metrics_config_and_plots(observed, recorded):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    (folder,) = (observed["run_dir"] / "wandb").glob("offline-run-*")
    run = read_run(folder)
    got: dict[str, dict[int, float]] = {}
    for row in run["history"]:
        for key, value in row.items():
            if isinstance(value, int | float) and not key.startswith("_"):
                got.setdefault(key, {})[row["_step"]] = float(value)
    _assert_same(got, recorded)
    images = {k.rsplit("/", 1)[0] for row in run["history"] for k, v in row.items() if v == "image-file"}
    assert PLOTS <= images
    assert run["config"]["job"]["steps"] == 2 and run["config"]["logging"]["backends"] == [
        "tensorboard",
        "wandb",
        "mlflow",
    ]
    assert list((folder / "files" / "media" / "images").rglob("*.png")), "the plots' files are in the run"


def test_mlflow_store_holds_the_metrics_config_and_plots(observed, recorded):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient

    run_dir = observed["run_dir"]
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("observed")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == observed["job"].job_id
    got = {k: {m.step: m.value for m in client.get_metric_history(run.info.run_id, k)} for k in recorded}
    _assert_same(got, recorded)
    assert run.data.params["job.steps"] == "2" and run.data.params["rollout.n"] == "2"
    plots = {Path(f.path).stem for f in client.list_artifacts(run.info.run_id, "plots")}
    assert {p.removeprefix("plots/") for p in PLOTS} <= plots
    assert "config.yaml" in {f.path for f in client.list_artifacts(run.info.run_id)}
