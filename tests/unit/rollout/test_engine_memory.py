"""Sleeping engines (colocated mode): the transformers engine frees its KV cache and weight storages while
idle, refuses generation and updates into released memory, and serves again, bit-exact, once its weights are
re-taken and refilled; the SGLang / vLLM adapters call their servers' own memory endpoints."""

from __future__ import annotations

import time

import pytest
from _rollout_fake_servers import FakeSGLang, FakeVLLM
from safetensors.torch import load_file

from meshrl.common import weights as W
from meshrl.common.errors import FailedPrecondition, InvalidArgument
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.sglang_engine import SGLangEngine
from meshrl.rollout.types import DiskUpdate, GenerationRequest, SamplingParams
from meshrl.rollout.vllm_engine import VLLMEngine

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def test_transformers_engine_releases_and_refills_its_weights(model_dir, tmp_path, new_engine):
    engine = new_engine(model_dir)
    prompt = [2, 7, 1, 8]
    before = engine.generate([GenerationRequest(prompt, GREEDY)])[0].token_ids
    assert engine.release_memory() == ["kv_cache", "weights"]
    assert all(p.numel() == 0 for p in engine.runner.model.parameters())
    waiting = engine.submit(GenerationRequest(prompt, GREEDY))
    time.sleep(0.2)
    assert not waiting.done()  # asleep: requests wait
    tensors = sorted(load_file(str(model_dir / "model.safetensors")).items())
    pub = W.write_version(str(tmp_path / "w"), 1, tensors, fsync=False)
    with pytest.raises(FailedPrecondition, match="resume_memory"):
        engine.update_weights_from_disk(DiskUpdate(pub.path, 1))
    assert engine.resume_memory(["weights"]) == ["kv_cache"]
    assert all(p.numel() > 0 for p in engine.runner.model.parameters())
    engine.update_weights_from_disk(DiskUpdate(pub.path, 1))  # the trainer's publication refills them in place
    assert not waiting.done()  # kv_cache still released
    assert engine.resume_memory(["kv_cache"]) == []
    assert waiting.result(timeout=60).token_ids == before
    with pytest.raises(InvalidArgument, match="not among"):
        engine.release_memory(["activations"])


def test_release_refuses_while_requests_run(model_dir, new_engine):
    engine = new_engine(model_dir)
    running = engine.submit(GenerationRequest([1, 2], SamplingParams(max_tokens=80, ignore_eos=True)))
    with pytest.raises(FailedPrecondition, match="idle"):  # at once: the request is queued or decoding
        engine.release_memory()
    assert len(running.result(timeout=60).token_ids) == 80  # it went on


def test_http_engines_call_their_servers_memory_endpoints(model_dir):
    fake = FakeSGLang()
    engine = SGLangEngine(EngineConfig(kind="sglang", model_path=str(model_dir), sglang={"url": fake.url}))
    try:
        assert engine.release_memory() == ["kv_cache", "weights"]
        assert engine.resume_memory(["weights"]) == ["kv_cache"]
        assert fake.calls("/release_memory_occupation") == [{"tags": ["weights", "kv_cache"]}]
        assert fake.calls("/resume_memory_occupation") == [{"tags": ["weights"]}]
    finally:
        engine.shutdown()
        fake.close()
    fake = FakeVLLM()  # a CUDA build's replies (the CPU build frees nothing asleep)
    engine = VLLMEngine(EngineConfig(kind="vllm", model_path=str(model_dir), vllm={"url": fake.url}))
    try:
        assert engine.release_memory() == ["kv_cache", "weights"]
        assert engine.resume_memory(["weights"]) == ["kv_cache"]
        assert engine.resume_memory(["weights"]) == ["kv_cache"]  # not asleep: not sent (vLLM would stay paused)
        assert engine.resume_memory(["kv_cache"]) == []
        queries = [q for q in fake.queries if q[0] in ("/sleep", "/wake_up")]
        assert queries == [("/sleep", "level=2"), ("/wake_up", "tags=weights"), ("/wake_up", "")]
    finally:
        engine.shutdown()
        fake.close()
