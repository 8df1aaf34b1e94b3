"""A colocated job refuses `meshrl scale` (its replicas share the trainer's bundle, which has no room for more)
with FAILED_PRECONDITION and the fix, and its fleet is left as it was."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from meshrl.common.config import load_config
from meshrl.common.errors import FailedPrecondition
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.events import EventLog
from meshrl.scheduler.step.job.colocate import Turns
from meshrl.scheduler.step.job.runner import JobRunner
from meshrl.scheduler.workflow import load_builtin


def test_scaling_a_colocated_job_is_refused(tmp_path):
    cfg = load_config(
        JobConfig, env={}, overrides=["model.path=m", "data.train=t.jsonl", "services.placement=colocated"]
    )
    runner = JobRunner(load_builtin("grpo"), cfg, SimpleNamespace(root=tmp_path), "j", EventLog("j"))
    runner.turns = Turns(lambda: [], SimpleNamespace())
    started = []
    fleet = SimpleNamespace(addresses=lambda: ["127.0.0.1:1"])
    svc = SimpleNamespace(registry=None, fleet=fleet, add_replicas=lambda n: started.append(n))
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            runner.request_scale(3, timeout=30)
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    while runner.scaling.target is None and asker.is_alive():
        threading.Event().wait(0.01)
    runner.scaling.apply(svc, publisher=None, colocated=True)  # what the step loop does before its next step
    asker.join(30)
    assert len(errors) == 1 and isinstance(errors[0], FailedPrecondition)
    assert "services.placement: colocated" in str(errors[0]) and "disaggregated" in str(errors[0])
    assert started == [] and runner.scaling.addresses == ["127.0.0.1:1"]
