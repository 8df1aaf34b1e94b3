"""A colocated GRPO job through real services on Ray (`services.placement: colocated`): the trainer and the
replica run in one placement-group bundle, the replica gives its memory up while the trainer computes (its
resident memory drops, as it reports), wakes with the published weights (verified), and the rollout service's
own spans show the order of its calls in every step."""

import json

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb

from .conftest import job_config, run_job

ROLLOUT_CALLS = ("GenerateBatch", "ReleaseMemory", "ResumeMemory", "UpdateWeightsFromDisk", "GetWeightChecksums")


def rollout_calls(run) -> list[str]:
    """The rollout service's server spans of the calls above, in the order they started."""
    spans = [json.loads(line) for f in run.traces.glob("rollout-0*.jsonl") for line in f.read_text().splitlines()]
    named = [(s["start_ns"], s["name"].rsplit("/", 1)[-1]) for s in spans if s["kind"] == "SERVER"]
    return [name for _, name in sorted(named) if name in ROLLOUT_CALLS]


def test_colocated_grpo_job_shares_a_bundle_and_sleeps_in_order(tiny_task, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    config = job_config(
        tiny_task,
        tmp_path,
        job={"name": "coloc", "steps": 2, "run_root": str(tmp_path)},
        services={"use_ray": True, "placement": "colocated"},
        checkpoint={"every": 1},
        eval={"every": 1, "max_prompts": 4},
    )
    record = run_job("grpo", config)
    assert record.state == spb.JOB_STATE_SUCCEEDED, record.error
    run = record.runner.run
    (line,) = [e for e in run.events_file.read_text().splitlines() if "colocated on one bundle" in e]
    where = json.loads(line)["log"].split(": ", 1)[1]
    trainer, rollout = (part.split(": ", 1)[1] for part in where.split(", rollout-0"))
    assert trainer.startswith("group ") and trainer == rollout.lstrip(": ")  # same group, same bundle
    steps = [json.loads(s) for s in run.metrics_file.read_text().splitlines()]
    assert [s["weights/version"] for s in steps] == [2, 3] and all(s["weights/stale_replicas"] == 0 for s in steps)
    for s in steps:  # what the replica reported around its release in that step
        assert s["colocate/replica_rss_asleep_mib"] < s["colocate/replica_rss_awake_mib"]
        assert s["colocate/trainer_offloaded_mib"] == 0.0  # a CPU trainer's state already lives in host memory
    calls = rollout_calls(run)
    step = ["GenerateBatch", "ReleaseMemory", "ResumeMemory", "UpdateWeightsFromDisk", "ResumeMemory"]
    text = " ".join(calls)
    assert text.count(" ".join(step)) == 2, calls  # both steps: generate, sleep, wake weights, refill + verify, KV
    assert "GetWeightChecksums" not in calls  # each refill's reply carried the checksums verified
