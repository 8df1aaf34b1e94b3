"""`meshrl up`'s plan: the scheduler starts after the services its jobs name, and its config (as the supervisor
fills it in) allows jobs exactly those addresses and the developer's folders (meshrl.scheduler.job_permissions);
the trainer and the replicas may touch only the run folders and those folders (paths.roots)."""

from __future__ import annotations

import argparse

from meshrl.common.config import parse_overrides
from meshrl.scheduler.config import SchedulerServiceConfig
from meshrl.scheduler.launch.local_cluster import _plan
from meshrl.scheduler.launch.supervisor import _fill
from meshrl.trainer.config import TrainerConfig


def _config(model, planned, addresses: dict[str, str]):
    filled = [_fill(a, addresses) for a in planned.args]
    sets = [filled[i + 1] for i, a in enumerate(filled) if a == "--set"]
    return model.model_validate(parse_overrides(sets))


def test_the_scheduler_starts_last_and_allows_only_the_clusters_services(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(
        model=str(tmp_path / "models" / "tiny"),
        replicas=2,
        redis_url=None,
        timeout=30.0,
        max_restarts=1,
        job_roots=None,
    )
    plan = _plan(args, tmp_path / ".meshrl")
    assert [[s.name for s in stage] for stage in plan.stages] == [
        ["databuffer"],
        ["trainer", "rollout-0", "rollout-1"],
        ["scheduler"],
    ]
    addresses = {
        name: f"127.0.0.1:{5000 + i}" for i, name in enumerate(["databuffer", "trainer", "rollout-0", "rollout-1"])
    }
    (scheduler,) = plan.stages[-1]
    cfg = _config(SchedulerServiceConfig, scheduler, addresses)
    assert sorted(cfg.job_permissions.peer_addresses) == sorted(addresses.values())
    assert cfg.job_permissions.write_roots == [str(tmp_path), str(tmp_path / "models")]
    assert cfg.job_permissions.ray_addresses == [] and cfg.job_permissions.data_generators == []
    trainer = _config(TrainerConfig, plan.stages[1][0], addresses)
    assert trainer.paths.roots == [
        str((tmp_path / ".meshrl" / "runs").resolve()),
        str(tmp_path),
        str(tmp_path / "models"),
    ]
