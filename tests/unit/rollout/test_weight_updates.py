"""Weight updates of the transformers engine from a trainer-published folder and over a gloo group:
bit-exact, in place, versioned per token; bad versions refused while the old weights keep serving."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from meshrl.common import weights as W
from meshrl.common.errors import DataLoss, InvalidArgument
from meshrl.common.net import free_port
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.types import DiskUpdate, GenerationRequest, GroupUpdate, PauseMode, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def hf_tensors(model_dir: Path, scale: float, seed: int) -> dict[str, torch.Tensor]:
    """The model's checkpoint tensors, perturbed (a stand-in for a train step)."""
    g = torch.Generator().manual_seed(seed)
    base = load_file(str(model_dir / "model.safetensors"))
    return {n: t + scale * torch.randn(t.shape, generator=g) for n, t in sorted(base.items())}


def publish(root: Path, model_dir: Path, version: int, tensors: dict[str, torch.Tensor]):
    """What the trainer does: a versioned folder with the model's config beside the weights."""
    extra = {name: (model_dir / name).read_bytes() for name in ("config.json", "generation_config.json")}
    return W.write_version(
        str(root), version, list(tensors.items()), extra_files=extra, bucket_bytes=20_000, fsync=False
    )


def live(engine) -> dict[str, torch.Tensor]:
    return engine.runner.named_parameters()


def test_disk_update_is_bit_exact_in_place_and_equals_a_fresh_engine(model_dir, tmp_path, new_engine):
    engine = new_engine(model_dir)
    new = hf_tensors(model_dir, 0.05, seed=1)
    pub = publish(tmp_path / "weights", model_dir, 1, new)
    ptrs = {n: t.data_ptr() for n, t in live(engine).items()}
    result = engine.update_weights_from_disk(DiskUpdate(pub.path, 1, manifest_sha256=pub.manifest_sha256))
    assert result.version == 1 and engine.weight_version == 1 and result.bytes > 0
    params = live(engine)
    for name, t in new.items():
        assert torch.equal(params[name], t), name
    assert {n: t.data_ptr() for n, t in params.items()} == ptrs  # copied into the same storage
    version, sums = engine.weight_checksums()
    assert version == 1 and sums == W.tensor_checksums(new)  # the trainer's sample and hashes
    fresh = new_engine(Path(pub.path))
    prompt = [3, 1, 4, 1, 5]
    a = engine.generate([GenerationRequest(prompt, GREEDY)])[0]
    b = fresh.generate([GenerationRequest(prompt, GREEDY)])[0]
    assert a.token_ids == b.token_ids and a.weight_versions == [1] * 12


def test_in_place_update_mid_generation_stamps_later_tokens_with_the_new_version(model_dir, tmp_path, new_engine):
    engine = new_engine(model_dir)
    pub = publish(tmp_path / "w", model_dir, 1, hf_tensors(model_dir, 0.05, seed=2))
    long = SamplingParams(temperature=0, max_tokens=70, ignore_eos=True)
    fut = engine.submit(GenerationRequest([1, 2, 3], long))
    while not engine.batcher.running:
        time.sleep(0.005)
    engine.update_weights_from_disk(DiskUpdate(pub.path, 1, pause_mode=PauseMode.IN_PLACE, flush_cache=True))
    result = fut.result(timeout=60)
    versions = result.weight_versions
    assert len(versions) == 70 and versions[0] == 0 and versions[-1] == 1
    assert versions == sorted(versions)  # old tokens, then new ones
    assert result.min_version == 0 and result.max_version == 1


def test_bad_updates_are_refused_and_the_old_weights_keep_serving(model_dir, tmp_path, new_engine):
    engine = new_engine(model_dir)
    replica = RolloutReplica(engine, replica_id="r", capacity=8)
    replica.mark_serving()
    before = {n: t.clone() for n, t in live(engine).items()}
    good = publish(tmp_path / "w", model_dir, 2, hf_tensors(model_dir, 0.05, seed=3))
    # corrupted file
    shard = next(Path(good.path).glob("model-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataLoss, match="corrupt"):
        replica.update_weights_from_disk(DiskUpdate(good.path, 2))
    # manifest replaced
    other = publish(tmp_path / "w2", model_dir, 2, hf_tensors(model_dir, 0.05, seed=4))
    with pytest.raises(DataLoss, match="sha256"):
        replica.update_weights_from_disk(DiskUpdate(other.path, 2, manifest_sha256="0" * 64))
    # wrong shape / missing tensor
    bad = hf_tensors(model_dir, 0.0, seed=5)
    bad["model.norm.weight"] = torch.ones(7)
    with pytest.raises(InvalidArgument, match="shape"):
        replica.update_weights_from_disk(DiskUpdate(publish(tmp_path / "w3", model_dir, 2, bad).path, 2))
    partial = dict(list(hf_tensors(model_dir, 0.0, seed=6).items())[:-2])
    with pytest.raises(InvalidArgument, match="missing"):
        replica.update_weights_from_disk(DiskUpdate(publish(tmp_path / "w4", model_dir, 2, partial).path, 2))
    assert engine.weight_version == 0
    assert all(torch.equal(before[n], t) for n, t in live(engine).items())
    # an older version than the served one
    replica.update_weights_from_disk(DiskUpdate(other.path, 2))
    assert engine.weight_version == 2
    old = publish(tmp_path / "w5", model_dir, 1, hf_tensors(model_dir, 0.05, seed=7))
    with pytest.raises(InvalidArgument, match="older"):
        replica.update_weights_from_disk(DiskUpdate(old.path, 1))
    assert engine.weight_version == 2
    assert engine.generate([GenerationRequest([1, 2], GREEDY)])[0].weight_versions == [2] * 12


def test_gloo_distributed_update_matches_the_trainer_bit_for_bit(model_dir, new_engine):
    engine = new_engine(model_dir)
    port = free_port()

    def spec(rank: int) -> W.GroupSpec:
        return W.GroupSpec("127.0.0.1", port, 2, rank, "test-weights", "gloo", 60.0)

    with ThreadPoolExecutor(2) as pool:
        trainer_f = pool.submit(W.WeightGroup.join, spec(0))
        assert engine.init_weight_update_group(spec(1)) == 1
        trainer = trainer_f.result(timeout=60)
    try:
        for version, seed in ((1, 8), (2, 9)):  # two updates over one group
            new = hf_tensors(model_dir, 0.05, seed=seed)
            ptrs = {n: t.data_ptr() for n, t in live(engine).items()}
            with ThreadPoolExecutor(1) as pool:
                sent = pool.submit(trainer.send, list(new.items()), version, bucket_bytes=20_000)
                result = engine.update_weights_from_distributed(
                    GroupUpdate("test-weights", version, timeout_seconds=60)
                )
                sent.result(timeout=60)
            assert result.version == version and engine.weight_version == version
            params = live(engine)
            assert all(torch.equal(params[n], t) for n, t in new.items())
            assert {n: t.data_ptr() for n, t in params.items()} == ptrs
            assert engine.weight_checksums()[1] == W.tensor_checksums(new)
        # a version other than the announced one is refused, and the group stays usable
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(trainer.send, list(hf_tensors(model_dir, 0.05, seed=10).items()), 4)
            with pytest.raises(InvalidArgument, match="announced"):
                engine.update_weights_from_distributed(GroupUpdate("test-weights", 3, timeout_seconds=60))
            with pytest.raises(W.UpdateRefused):
                sent.result(timeout=60)
        assert engine.weight_version == 2
    finally:
        engine.destroy_weight_update_group("test-weights")
        trainer.destroy()


def test_delta_update_is_bit_exact_pauses_only_to_copy_and_needs_its_base(model_dir, tmp_path, new_engine):
    engine = new_engine(model_dir)
    replica = RolloutReplica(engine, replica_id="r", capacity=8)
    root = tmp_path / "w"
    v1 = hf_tensors(model_dir, 0.05, seed=1)
    base = W.DeltaBase()
    full = W.write_version(str(root), 1, base.record(1, list(v1.items())), fsync=False)
    replica.update_weights_from_disk(DiskUpdate(full.path, 1, manifest_sha256=full.manifest_sha256))
    v2 = {n: t + 1e-3 * torch.randn_like(t) for n, t in v1.items()}
    delta, _ = W.write_delta(str(root), 2, base, list(v2.items()), max_fraction=1.0, fsync=False)
    v3 = {n: t + 1e-3 for n, t in v2.items()}
    later, _ = W.write_delta(str(root), 3, base, list(v3.items()), max_fraction=1.0, fsync=False)
    with pytest.raises(W.BaseMismatch, match="against version 2, but this replica serves 1"):  # missed v2
        replica.update_weights_from_disk(DiskUpdate(later.path, 3, manifest_sha256=later.manifest_sha256, delta_base=2))
    assert engine.weight_version == 1 and all(torch.equal(live(engine)[n], t) for n, t in v1.items())
    result = replica.update_weights_from_disk(
        DiskUpdate(delta.path, 2, manifest_sha256=delta.manifest_sha256, delta_base=1)
    )
    assert result.version == engine.weight_version == 2 and 0 < result.pause_seconds <= result.seconds
    assert engine.weight_checksums()[1] == W.tensor_checksums(v2)
    assert all(torch.equal(live(engine)[n], t) for n, t in v2.items())
