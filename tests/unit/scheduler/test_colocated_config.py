"""`services.placement: colocated` is checked when the job config loads (the error names the setting that
stands in the way and the fix), and each colocated actor's claim on the shared bundle is what Ray can split."""

import pytest

from meshrl.common.config import load_config
from meshrl.common.errors import ConfigError, InvalidArgument
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.launch.placement import bundle_shares

BASE = ["model.path=m", "data.train=t.jsonl", "services.placement=colocated"]


def load(*overrides: str) -> JobConfig:
    return load_config(JobConfig, env={}, overrides=[*BASE, *overrides])


def test_a_plain_colocated_job_loads():
    cfg = load("trainer.gpus=1", "rollout.gpus_per_replica=1")
    assert cfg.services.placement == "colocated" and cfg.training.mode == "sync"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["training.mode=one_step_off"], "training.mode must be 'sync'"),
        (["training.mode=async", "training.max_staleness=1"], "training.mode must be 'sync'"),
        (["services.use_ray=false"], "services.use_ray: true"),
        (["trainer.address=127.0.0.1:5"], "unset trainer.address"),
        (['rollout.addresses=["127.0.0.1:6"]'], "empty rollout.addresses"),
        (["rollout.registry.redis_url=redis://127.0.0.1:6379/0"], "unset rollout.registry.redis_url"),
        (["rollout.replicas=0"], "rollout.replicas >= 1"),
        (["weights.delta=true"], "weights.delta: false"),
        (["warmup.steps=10", "warmup.eval_accuracy_every=5"], "warmup.eval_accuracy_every: 0"),
    ],
)
def test_what_cannot_run_colocated_is_refused_with_the_fix(overrides, message):
    with pytest.raises(ConfigError, match="services.placement = 'colocated'") as err:
        load(*overrides)
    assert message in str(err.value) and "services.placement: disaggregated" in str(err.value)


def test_each_colocated_actor_claims_what_ray_can_split():
    assert bundle_shares({"CPU": 1.0, "GPU": 1.0}, 2) == (0.5, 0.5)  # trainer + replica on one GPU
    assert bundle_shares({"CPU": 1.0}, 2) == (0.5, 0.0)  # the CPU twin
    assert bundle_shares({"CPU": 2.0, "GPU": 4.0}, 2) == (1.0, 0.0)  # 4 GPUs: both see all four, none claimed
    with pytest.raises(InvalidArgument, match="at least one member"):
        bundle_shares({"CPU": 1.0}, 0)
