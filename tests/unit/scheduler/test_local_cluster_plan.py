"""`meshrl up`'s plan: the scheduler starts after the services its jobs name, and its config (as the supervisor
fills it in) allows jobs exactly those addresses and the developer's folders (meshrl.scheduler.job_permissions);
the trainer and the replicas may touch only the run folders and those folders (paths.roots); with --token-file
every service requires the token and every channel between them sends it."""

from __future__ import annotations

import argparse

from meshrl.common.config import parse_overrides
from meshrl.databuffer.config import DataBufferConfig
from meshrl.rollout.config import RolloutConfig
from meshrl.scheduler.config import SchedulerServiceConfig
from meshrl.scheduler.launch.local_cluster import _plan
from meshrl.scheduler.launch.supervisor import _fill
from meshrl.trainer.config import TrainerConfig


def _config(model, planned, addresses: dict[str, str]):
    filled = [_fill(a, addresses) for a in planned.args]
    sets = [filled[i + 1] for i, a in enumerate(filled) if a == "--set"]
    return model.model_validate(parse_overrides(sets))


def _args(tmp_path, token_file=None) -> argparse.Namespace:
    return argparse.Namespace(
        model=str(tmp_path / "models" / "tiny"),
        replicas=2,
        redis_url=None,
        timeout=30.0,
        max_restarts=1,
        job_roots=None,
        token_file=token_file,
    )


def test_the_scheduler_starts_last_and_allows_only_the_clusters_services(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = _plan(_args(tmp_path), tmp_path / ".meshrl")
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


def test_a_secured_set_requires_the_token_everywhere_and_sends_it_on_every_channel(tmp_path):
    token = tmp_path / "token"
    token.write_text("local-secret\n")
    plan = _plan(_args(tmp_path, str(token)), tmp_path / ".meshrl")
    addresses = {name: "127.0.0.1:1" for name in ["databuffer", "trainer", "rollout-0", "rollout-1"]}
    (databuffer,), (trainer, *replicas), (scheduler,) = plan.stages
    configs = [
        _config(DataBufferConfig, databuffer, addresses),
        _config(TrainerConfig, trainer, addresses),
        *(_config(RolloutConfig, r, addresses) for r in replicas),
        _config(SchedulerServiceConfig, scheduler, addresses),
    ]
    for cfg in configs:
        assert cfg.server.require_auth and cfg.server.auth.token() == "local-secret"
    for cfg in configs[1:-1]:
        assert cfg.databuffer.auth.token() == "local-secret"
    channels = configs[-1].channels
    assert {channels.databuffer.auth.token(), channels.trainer.auth.token(), channels.rollout.auth.token()} == {
        "local-secret"
    }
