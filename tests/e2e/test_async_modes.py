"""Asynchronous training through the real services: eta = 0 in `async` mode reproduces the `sync` run's
metrics and evaluations exactly (same seeds, fp32), with the decoupled-PPO importance weights (TIS + MIS
against the rollout's log-probs, one weight per response as the asynchronous modes' default) in the loss.
(The staleness bound, back-pressure and cancel are checked over whole runs in
tests/unit/scheduler/test_async_pipeline.py.)"""

from __future__ import annotations

import json

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb

from .conftest import job_config, run_job

VOLATILE = ("time/", "async/", "busy/", "buffer/")  # timings, the overlap figures and the stream's bytes


def spread_reward(prompts, responses, answers):
    """A deterministic reward with spread on a random model's output, so that advantages are not all zero."""
    return [(sum(map(ord, r)) % 7) / 6.0 for r in responses]


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _stable(rows: list[dict]) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith(VOLATILE) and "seconds" not in k and "per_second" not in k}
        for r in rows
    ]


def test_async_with_eta_zero_reproduces_sync(tiny_task, tmp_path):
    runs = {}
    for name, training in (("sync", {"mode": "sync"}), ("async0", {"mode": "async", "max_staleness": 0})):
        root = str(tmp_path / name)
        config = job_config(
            tiny_task,
            tmp_path / name,
            job={"name": name, "steps": 2, "run_root": root, "allowed_modules": ["meshrl", "tests"]},
            algorithm={
                "reward": "tests.e2e.test_async_modes:spread_reward",
                # the asynchronous modes' correction, written out so that sync runs the same loss
                "loss": {"tis_cap": 2.0, "mis_cap": 4.0, "is_level": "sequence"},
            },
            eval={"every": 0, "max_prompts": 4},  # step 0 and the end
            training=training,
        )
        record = run_job("grpo", config)
        assert record.state == spb.JOB_STATE_SUCCEEDED, record.error
        runs[name] = record.runner.run
    sync, async0 = (_rows(runs[m].metrics_file) for m in ("sync", "async0"))
    assert [m["step"] for m in async0] == [1, 2]
    assert any(m["advantage/abs_max"] > 0 for m in sync)  # the steps did learn something
    assert "actor/tis_weight" in sync[0] and "actor/is_masked_fraction" in sync[0]
    assert _stable(async0) == _stable(sync)
    assert all(m["async/staleness_0"] == 4 and m["async/staleness_max"] == 0 for m in async0)
    assert _stable(_rows(runs["async0"].eval_file)) == _stable(_rows(runs["sync"].eval_file))
