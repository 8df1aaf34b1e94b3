"""A job with a supervised warm-up through real services: held-out accuracy during the warm-up
(`warmup.eval_accuracy_every`) comes from the replicas serving the actor's weights of that moment (each
evaluation publishes them first), is written to warmup.jsonl beside the loss and kept out of eval.jsonl; the
evaluations between RL steps find their batches although each step's batches are deleted in the background."""

import json

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb

from .conftest import job_config, run_job


def test_warm_up_reports_held_out_accuracy_on_the_weights_of_the_moment(tiny_task, tmp_path):
    warmup = {"steps": 5, "batch_size": 8, "lr": 1e-2, "eval_accuracy_every": 2}
    job = {"name": "e2e", "steps": 3, "run_root": str(tmp_path)}
    eval_every = {"every": 1, "max_prompts": 4}  # after steps 1 and 2, under their keys, while they are deleted
    record = run_job("grpo", job_config(tiny_task, tmp_path, warmup=warmup, job=job, eval=eval_every))
    assert record.state == spb.JOB_STATE_SUCCEEDED, record.error
    run = record.runner.run
    points = [json.loads(x) for x in (run.root / "warmup.jsonl").read_text().splitlines()]
    assert [p["step"] for p in points] == [1, 2, 3, 4, 5]
    measured = [p for p in points if "heldout_accuracy" in p]
    assert [p["step"] for p in measured] == [2, 4]  # step 5's is RL's step-0 evaluation
    assert all(0.0 <= p["heldout_accuracy"] <= 1.0 and 0.0 <= p["heldout_reward"] <= 1.0 for p in measured)
    evals = [json.loads(x) for x in run.root.joinpath("eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 1, 2, 3]  # the warm-up's evaluations are not RL's
    events = run.events_file.read_text()
    assert "held-out accuracy" in events
    # every warm-up evaluation published the actor's weights first: versions 1, 2, then 3 after the warm-up
    metrics = [json.loads(x) for x in run.metrics_file.read_text().splitlines()]
    assert metrics[0]["weights/version"] == 4
