"""Weight publication through real services: disk and gloo-distributed updates reach both replicas
bit-exactly (checksums verified against the trainer), and a replica frozen with SIGSTOP during a
distributed update is left out within the deadline while the other one gets the version; after
SIGCONT it is refitted before it serves again."""

import os
import signal
import time

import pytest

from meshrl.scheduler.clients import RolloutClient, TrainerClient
from meshrl.scheduler.config import WeightsSection
from meshrl.scheduler.fleet.weight_sync import WeightPublisher
from meshrl.scheduler.launch.launcher import ProcessLauncher, ServiceSpec


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    from meshrl.trainer.model_builder import build_small_model

    root = tmp_path_factory.mktemp("weights")
    model = str(build_small_model(root / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1))
    launcher = ProcessLauncher(root / "logs", start_timeout=120)
    try:
        buffer = launcher.start(
            [ServiceSpec("databuffer", "databuffer", ["--set", f"redis.embedded.data_dir={root}/r"])]
        )
        with_buffer = ["--set", f"databuffer_address={buffer['databuffer']}"]
        specs = [ServiceSpec("trainer", "trainer", with_buffer)] + [
            ServiceSpec("rollout", f"rollout-{i}", [*with_buffer, "--set", f"engine.model_path={model}"])
            for i in range(2)
        ]
        addresses = launcher.start(specs)
        trainer = TrainerClient(addresses["trainer"])
        trainer.load_model("actor", model, "float32", None, 0)
        replicas = [RolloutClient(addresses[f"rollout-{i}"]) for i in range(2)]
        yield {"launcher": launcher, "trainer": trainer, "replicas": replicas, "root": root}
    finally:
        launcher.stop_all(grace=5)


@pytest.mark.parametrize("transport", ["disk", "distributed"])
def test_update_reaches_every_replica_bit_exactly(services, transport):
    cfg = WeightsSection(transport=transport, timeout_seconds=30)
    publisher = WeightPublisher(services["trainer"], cfg, str(services["root"] / f"w-{transport}"))
    publisher.version = max(r.status().weight_version for r in services["replicas"])
    trainer, asked = services["trainer"], []
    trainer.checksums = lambda *a, **k: asked.append(a) or TrainerClient.checksums(trainer, *a, **k)
    try:
        for _ in range(2):
            result = publisher.publish(services["replicas"])  # verifies versions and checksums, or raises
            assert result.stale == [] and result.bytes > 0
    finally:
        del trainer.checksums
    assert asked == []  # verify compared with the checksums the publish replies carried
    expected = services["trainer"].checksums("actor").sha256
    for replica in services["replicas"]:
        assert replica.status().weight_version == publisher.version
        assert dict(replica.checksums(list(expected)).sha256) == dict(expected)


def test_frozen_replica_is_left_out_then_refitted(services):
    cfg = WeightsSection(transport="distributed", timeout_seconds=8)
    publisher = WeightPublisher(services["trainer"], cfg, str(services["root"] / "w-frozen"))
    healthy, frozen = services["replicas"]
    publisher.version = max(r.status().weight_version for r in services["replicas"])
    publisher.publish([healthy, frozen])
    pid = services["launcher"].pid("rollout-1")
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        result = publisher.publish([healthy, frozen])
        took = time.monotonic() - start
    finally:
        os.kill(pid, signal.SIGCONT)
    assert result.stale == [frozen.address]
    assert took < 4 * cfg.timeout_seconds + 30  # bounded by the deadlines, never a hang
    assert healthy.status().weight_version == result.version  # the others continued
    assert frozen.status().weight_version < result.version
    publisher.refit_from_disk(frozen)  # before it serves again
    publisher.verify([healthy, frozen], result.version)


def test_refit_after_a_collective_publication_loads_the_current_version(services):
    """The refit bug: the last disk version only moved on disk publications, so a replica refitted
    after versions went over the collective loaded an old one (and was then given traffic)."""
    cfg = WeightsSection(transport="distributed", timeout_seconds=30)
    publisher = WeightPublisher(services["trainer"], cfg, str(services["root"] / "w-refit"))
    first, second = services["replicas"]
    publisher.version = max(r.status().weight_version for r in services["replicas"])
    publisher.publish([first, second])
    publisher.refit_from_disk(second)  # writes the current version to disk: the last disk version
    publisher.publish([first])  # one more version over the collective; `second` missed it
    publisher.refit_from_disk(second)
    assert second.status().weight_version == publisher.version
    publisher.verify([first, second], publisher.version)


def test_delta_publication_and_refit_of_a_replica_that_missed_the_base(services):
    """Deltas go to the replicas that hold their base; one that missed a version refuses the next delta
    (BaseMismatch) and the same publish refits it with a complete version, verified by checksums."""
    cfg = WeightsSection(transport="disk", delta=True, timeout_seconds=30)
    root = services["root"] / "w-delta"
    publisher = WeightPublisher(services["trainer"], cfg, str(root))
    both = services["replicas"]
    lagging = both[1]
    publisher.version = max(r.status().weight_version for r in both)
    first = publisher.publish(both)  # no base on the trainer yet: a complete version, kept as the base
    assert first.stale == [] and not first.disk.delta
    second = publisher.publish(both)
    assert second.stale == [] and second.disk.delta and second.disk.base_version == first.version
    assert (root / f"d{second.version:06d}").is_dir()
    publisher.publish([both[0]])  # the lagging replica misses this version
    behind = lagging.status().weight_version
    result = publisher.publish(both)  # a delta against a version it does not hold: refused, then refitted
    assert result.stale == [] and behind < result.version == lagging.status().weight_version
    assert not publisher.last_disk.delta  # the refit published the version complete
    publisher.verify(both, result.version)
