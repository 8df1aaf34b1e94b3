"""One GRPO step through real services placed by Ray (each a Ray actor on its placement-group
bundle, running its service process), with the scheduler passing only data-buffer keys."""

import json

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb

from .conftest import job_config, run_job


def test_grpo_step_on_ray_placed_services(tiny_task, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    config = job_config(
        tiny_task, tmp_path, job={"name": "ray", "steps": 1, "run_root": str(tmp_path)}, services={"use_ray": True}
    )
    record = run_job("grpo", config)
    assert record.state == spb.JOB_STATE_SUCCEEDED, record.error
    run = record.runner.run
    step = json.loads(run.metrics_file.read_text().splitlines()[0])
    assert step["weights/version"] == 2 and step["rollout/samples"] == 8
    # every service ran as its own process, with its own log, started by a Ray actor
    assert {p.stem for p in run.logs.glob("*.log")} == {"databuffer", "trainer", "rollout-0"}
    events = run.events_file.read_text()
    assert "services up" in events
