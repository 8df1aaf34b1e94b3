"""Weight publication through real services: disk and gloo-distributed updates reach both replicas
bit-exactly (checksums verified against the trainer), and a replica frozen with SIGSTOP during a
distributed update is left out within the deadline while the other one gets the version; after
SIGCONT it is refitted before it serves again."""

import json
import os
import shutil
import signal
import time
from pathlib import Path

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
        with_buffer = [
            "--set",
            f"databuffer_address={buffer['databuffer']}",
            "--set",
            f"paths.roots={json.dumps([str(root)])}",
        ]
        specs = [ServiceSpec("trainer", "trainer", with_buffer)] + [
            ServiceSpec("rollout", f"rollout-{i}", [*with_buffer, "--set", f"engine.model_path={model}"])
            for i in range(2)
        ]
        addresses = launcher.start(specs)
        trainer = TrainerClient(addresses["trainer"])
        trainer.load_model("actor", model, "float32", None, 0)
        replicas = [RolloutClient(addresses[f"rollout-{i}"]) for i in range(2)]
        yield {"launcher": launcher, "trainer": trainer, "replicas": replicas, "root": root, "model": Path(model)}
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


def _tensors(model: Path) -> list:
    from safetensors.torch import load_file

    return [t for f in model.glob("*.safetensors") for t in load_file(f).values()]


def _variant(model: Path, out: Path, change) -> str:
    """A copy of the model folder with `change(name, tensor)` applied to every tensor."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, out)
    for f in out.glob("*.safetensors"):
        save_file({n: change(n, t) for n, t in load_file(f).items()}, f, metadata={"format": "pt"})
    return str(out)


def test_delta_over_the_collective_refits_a_replica_that_missed_the_base(services):
    """Over the weight group: a complete version first, then a delta of a few changed tensors (a fraction of
    the bytes; every replica's checksums equal the trainer's); a replica that missed a version refuses the
    next delta and the same publish sends it complete; above max_delta_fraction a version goes complete."""
    cfg = WeightsSection(transport="distributed", delta=True, timeout_seconds=30)
    publisher = WeightPublisher(services["trainer"], cfg, str(services["root"] / "w-dcoll"))
    trainer, both, model = services["trainer"], services["replicas"], services["model"]
    publisher.version = max(r.status().weight_version for r in both)
    full_bytes = sum(t.numel() * t.element_size() for t in _tensors(model))
    assert publisher.publish(both).stale == []  # complete, or a delta against a base an earlier test left
    norms = _variant(model, services["root"] / "m-norms", lambda n, t: t * 1.5 if "norm" in n else t)
    trainer.load_model("actor", norms, "float32", None, 0)
    delta = publisher.publish(both)  # verifies every replica's checksums against the trainer's
    assert delta.stale == [] and 0 < delta.bytes < full_bytes / 10
    publisher.publish([both[0]])  # the second replica misses this version
    behind = both[1].status().weight_version
    refit = publisher.publish(both)  # refused by the second (BaseMismatch), then complete to both
    assert refit.stale == [] and behind < refit.version == both[1].status().weight_version
    assert refit.bytes >= full_bytes
    scaled = _variant(model, services["root"] / "m-scaled", lambda n, t: t * 1.5)
    trainer.load_model("actor", scaled, "float32", None, 0)
    above = publisher.publish(both)  # every element changed: the delta exceeds max_delta_fraction
    assert above.stale == [] and above.bytes == full_bytes
    expected = trainer.checksums("actor").sha256
    for replica in both:
        assert dict(replica.checksums(list(expected)).sha256) == dict(expected)
    trainer.load_model("actor", str(model), "float32", None, 0)
