"""Weight updates of the transformers engine from a trainer-published folder and over a gloo group:
bit-exact, in place, versioned per token; bad versions refused while the old weights keep serving."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from meshrl.common.errors import DataLoss, InvalidArgument
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.types import CollectiveGroupSpec, GenerationRequest, PauseMode, SamplingParams
from meshrl.rollout.weight_receiver import tensor_sha256
from meshrl.trainer.export import tensor_sha256 as trainer_sha256
from meshrl.trainer.publish import GroupSpec, WeightGroup, publish_to_disk
from safetensors.torch import load_file

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def hf_tensors(model_dir: Path, scale: float, seed: int) -> dict[str, torch.Tensor]:
    """The model's checkpoint tensors, perturbed (a stand-in for a train step)."""
    g = torch.Generator().manual_seed(seed)
    base = load_file(str(model_dir / "model.safetensors"))
    return {n: t + scale * torch.randn(t.shape, generator=g) for n, t in sorted(base.items())}


def publish(root: Path, model_dir: Path, version: int, tensors: dict[str, torch.Tensor]):
    names = list(tensors)
    buckets = [[(n, tensors[n]) for n in names[: len(names) // 2]], [(n, tensors[n]) for n in names[len(names) // 2 :]]]
    sums = {n: trainer_sha256(t) for n, t in tensors.items()}
    return publish_to_disk(buckets, root=root, version=version, model_path=model_dir, checksums=sums)


def live(engine) -> dict[str, torch.Tensor]:
    return engine.runner.parameters_by_name()


def test_disk_update_is_bit_exact_in_place_and_equals_a_fresh_engine(model_dir, tmp_path, new_engine):
    engine = new_engine(model_dir)
    new = hf_tensors(model_dir, 0.05, seed=1)
    pub = publish(tmp_path / "weights", model_dir, 1, new)
    ptrs = {n: t.data_ptr() for n, t in live(engine).items()}
    result = engine.update_weights_from_disk(pub.path, 1, manifest_sha256=pub.manifest_sha256)
    assert result.version == 1 and engine.weight_version == 1 and result.bytes > 0
    params = live(engine)
    for name, t in new.items():
        assert torch.equal(params[name], t), name
    assert {n: t.data_ptr() for n, t in params.items()} == ptrs  # copied into the same storage
    version, sums = engine.weight_checksums()
    assert version == 1 and sums and all(sums[n] == trainer_sha256(new[n]) for n in sums)
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
    engine.update_weights_from_disk(pub.path, 1, pause_mode=PauseMode.IN_PLACE, flush_cache=True)
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
    with pytest.raises(DataLoss, match="corrupted"):
        replica.update_weights_from_disk(good.path, 2)
    # manifest replaced
    other = publish(tmp_path / "w2", model_dir, 2, hf_tensors(model_dir, 0.05, seed=4))
    with pytest.raises(DataLoss, match="sha256"):
        replica.update_weights_from_disk(other.path, 2, manifest_sha256="0" * 64)
    # wrong shape / missing tensor
    bad = hf_tensors(model_dir, 0.0, seed=5)
    bad["model.norm.weight"] = torch.ones(7)
    with pytest.raises(InvalidArgument, match="shape"):
        replica.update_weights_from_disk(publish(tmp_path / "w3", model_dir, 2, bad).path, 2)
    partial = dict(list(hf_tensors(model_dir, 0.0, seed=6).items())[:-2])
    with pytest.raises(InvalidArgument, match="lacks"):
        replica.update_weights_from_disk(publish(tmp_path / "w4", model_dir, 2, partial).path, 2)
    assert engine.weight_version == 0
    assert all(torch.equal(before[n], t) for n, t in live(engine).items())
    # an older version than the served one
    replica.update_weights_from_disk(other.path, 2)
    assert engine.weight_version == 2
    old = publish(tmp_path / "w5", model_dir, 1, hf_tensors(model_dir, 0.05, seed=7))
    with pytest.raises(InvalidArgument, match="older"):
        replica.update_weights_from_disk(old.path, 1)
    assert engine.weight_version == 2
    assert engine.generate([GenerationRequest([1, 2], GREEDY)])[0].weight_versions == [2] * 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gloo_distributed_update_matches_the_trainer_bit_for_bit(model_dir, new_engine):
    engine = new_engine(model_dir)
    port = _free_port()
    name = "test-weights"
    with ThreadPoolExecutor(2) as pool:
        trainer_f = pool.submit(WeightGroup, GroupSpec("127.0.0.1", port, 2, 0, name, "gloo", 60.0))
        rank = engine.init_weight_update_group(CollectiveGroupSpec("127.0.0.1", port, 2, 1, name, "gloo", 60.0))
        trainer = trainer_f.result(timeout=60)
    assert rank == 1
    new = hf_tensors(model_dir, 0.05, seed=8)
    names = list(new)
    buckets = [[(n, new[n]) for n in names[:5]], [(n, new[n]) for n in names[5:]]]
    ptrs = {n: t.data_ptr() for n, t in live(engine).items()}
    sender = threading.Thread(target=trainer.send, args=(buckets, 2, 1))
    sender.start()
    result = engine.update_weights_from_distributed(name, 1, timeout_seconds=60)
    sender.join(timeout=60)
    assert result.version == 1 and engine.weight_version == 1
    params = live(engine)
    assert all(torch.equal(params[n], t) for n, t in new.items())
    assert {n: t.data_ptr() for n, t in params.items()} == ptrs
    _, sums = engine.weight_checksums(["model.norm.weight"])
    assert sums["model.norm.weight"] == tensor_sha256(new["model.norm.weight"])
    engine.destroy_weight_update_group(name)
    trainer.close()
