"""The vLLM adapter against a real vLLM 0.32 server (the CPU build): token log-probs equal the trainer's,
seeds, weight updates from disk and over the weight group verified by the next generation and by checksums,
an update landing mid-generation with every token's version, and the bad paths (a refused load, a torn
update) leaving the server alive and never serving a half-loaded model as if it were whole.

Weights "zero": the final norm set to zero makes every logit 0, so greedy decoding emits token 0 only; no
token of the served model's own greedy output is 0 (checked), so each generated token tells which
weights made it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from meshrl.api.common.v1 import weights_pb2
from meshrl.common import batch_schema as S
from meshrl.common import weight_group_secret
from meshrl.common import weights as W
from meshrl.common.codec import Ragged
from meshrl.common.errors import FailedPrecondition, MeshrlError
from meshrl.common.net import free_port
from meshrl.common.weights.engine_group import EngineGroupSender
from meshrl.rollout.types import DiskUpdate, GenerationRequest, GroupUpdate, PauseMode, SamplingParams, TornWeights
from tests._vllm import GROUP_TOKEN

PROMPTS = [[5, 6, 7], [40, 41], [100, 3, 9, 12]]
_versions = itertools.count(1)


def trainer_logprobs(model: Path, prompts, responses) -> np.ndarray:
    """The trainer's per-token log-probs (megatron-core, fp32, temperature 1) of `responses` after `prompts`."""
    from meshrl.trainer.core import TrainerCore

    def ragged(rows):
        offsets = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
        return Ragged(np.concatenate([np.asarray(r, dtype=np.int32) for r in rows]), offsets)

    core = TrainerCore()
    core.load_model("actor", str(model))
    columns = {S.PROMPT_IDS: ragged(prompts), S.RESPONSE_IDS: ragged(responses)}
    return core.compute_logprobs("actor", columns, temperature=1.0).values.values


def weights_of(model: Path, zero_norm: bool = False) -> dict[str, torch.Tensor]:
    tensors = load_file(str(model / "model.safetensors"))
    if zero_norm:
        tensors["model.norm.weight"] = torch.zeros_like(tensors["model.norm.weight"])
    return dict(sorted(tensors.items()))


def publish(model: Path, root: Path, version: int, tensors: dict[str, torch.Tensor]) -> weights_pb2.DiskWeights:
    extra = {"config.json": (model / "config.json").read_bytes()}
    return W.write_version(str(root), version, list(tensors.items()), extra_files=extra, fsync=False)


def greedy(engine, prompt, n=12) -> list[int]:
    sampling = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return engine.generate([GenerationRequest(prompt, sampling)], timeout=60)[0].token_ids


def load(engine, model: Path, root: Path, tensors, **kw) -> int:
    version = next(_versions) + engine.weight_version
    published = publish(model, root, version, tensors)
    engine.update_weights_from_disk(DiskUpdate(published.path, version, published.manifest_sha256, **kw))
    return version


def streaming(engine, request: GenerationRequest):
    """Submits `request` and returns its future once its own first token arrived (a request that ended first
    fails the test with its result)."""
    streamed = threading.Event()
    running = engine.submit(request, on_chunk=lambda chunk: chunk.token_ids and streamed.set())
    deadline = time.monotonic() + 60
    while not streamed.wait(0.01):
        assert not running.done(), f"the request ended before its first token: {running.result()}"
        assert time.monotonic() < deadline, "no token of the request arrived in 60 s"
    return running


def test_sampled_logprobs_equal_the_trainers(vllm_tied, tied_model):
    """n samples of each prompt at temperature 1, and greedy ones; seeds are not sent to the CPU build (its
    engine core dies rewinding a seeded generator), so samples differ from call to call there."""
    sampling = SamplingParams(temperature=1.0, max_tokens=10, seed=1, ignore_eos=True)
    requests = [GenerationRequest(p, sampling) for p in PROMPTS for _ in range(4)]
    results = vllm_tied.generate(requests, timeout=60)
    responses = [r.token_ids for r in results]
    want = trainer_logprobs(tied_model, [r.prompt_ids for r in requests], responses)
    got = np.concatenate([r.logprobs for r in results])
    assert np.abs(got - want).max() < 1e-4
    assert len({tuple(r) for r in responses[:4]}) > 1  # the samples of a prompt differ
    assert greedy(vllm_tied, PROMPTS[0]) == greedy(vllm_tied, PROMPTS[0])


def test_update_from_disk_is_what_the_next_generation_serves(vllm_tied, tied_model, tmp_path):
    before = greedy(vllm_tied, PROMPTS[0])
    assert 0 not in before
    zero = weights_of(tied_model, zero_norm=True)
    version = load(vllm_tied, tied_model, tmp_path / "w", zero)
    assert vllm_tied.weight_version == version and vllm_tied.served_version() == version
    assert greedy(vllm_tied, PROMPTS[0]) == [0] * 12
    assert vllm_tied.weight_checksums()[1] == W.tensor_checksums(zero)
    load(vllm_tied, tied_model, tmp_path / "w", weights_of(tied_model))
    assert greedy(vllm_tied, PROMPTS[0]) == before


def test_the_tied_output_layer_follows_new_embeddings(vllm_tied, tied_model, tmp_path):
    """The CPU build keeps a packed copy of the tied output layer: it must be made again after a reload."""
    moved = weights_of(tied_model)
    moved["model.embed_tokens.weight"] = moved["model.embed_tokens.weight"] * 3
    load(vllm_tied, tied_model, tmp_path / "w", moved)
    result = vllm_tied.generate([GenerationRequest(PROMPTS[1], SamplingParams(max_tokens=8, seed=5))], timeout=60)[0]
    moved_dir = tmp_path / "moved"
    publish(tied_model, moved_dir, 1, moved)
    folder = moved_dir / "v000001"
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (folder / name).write_bytes((tied_model / name).read_bytes())
    want = trainer_logprobs(folder, [PROMPTS[1]], [result.token_ids])
    assert np.abs(np.asarray(result.logprobs) - want).max() < 1e-4
    load(vllm_tied, tied_model, tmp_path / "w", weights_of(tied_model))


def test_an_update_landing_mid_generation_records_each_tokens_version(vllm_tied, tied_model, tmp_path):
    prompt = PROMPTS[2]
    old = greedy(vllm_tied, prompt, 200)
    version = next(_versions) + vllm_tied.weight_version
    zero = publish(tied_model, tmp_path / "w", version, weights_of(tied_model, zero_norm=True))  # before the request
    running = streaming(
        vllm_tied, GenerationRequest(prompt, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    )
    vllm_tied.update_weights_from_disk(
        DiskUpdate(zero.path, version, zero.manifest_sha256, pause_mode=PauseMode.IN_PLACE, flush_cache=False)
    )
    out = running.result(timeout=120)
    assert len(out.token_ids) == 200
    first = out.weight_versions[0]
    made_before = out.weight_versions.count(first)
    assert first < version and 0 < made_before < 200, "the update landed before or after the whole generation"
    assert out.weight_versions == [first] * made_before + [version] * (200 - made_before)
    assert out.token_ids[:made_before] == old[:made_before]  # the old weights' tokens, under the old version
    assert out.token_ids[made_before:] == [0] * (200 - made_before)  # every later token from the new weights
    load(vllm_tied, tied_model, tmp_path / "w", weights_of(tied_model))


@pytest.mark.parametrize("delay", [0.02, 0.05, 0.1])
def test_updates_landing_just_after_a_request_started_never_hang_it(vllm_tied, tied_model, tmp_path, delay):
    """The retracting pause of the 0.11 adapter hung 3 of 12 such updates (and the process could not exit)."""
    for _ in range(2):
        running = vllm_tied.submit(GenerationRequest(PROMPTS[1], SamplingParams(max_tokens=60, ignore_eos=True)))
        time.sleep(delay)
        version = load(vllm_tied, tied_model, tmp_path / "w", weights_of(tied_model), pause_mode=PauseMode.IN_PLACE)
        out = running.result(timeout=60)
        assert len(out.token_ids) == 60 and out.weight_versions == sorted(out.weight_versions)
        assert out.weight_versions[-1] in (version, out.weight_versions[0])


def test_abort_pause_ends_requests_and_generation_goes_on(vllm_tied):
    running = streaming(vllm_tied, GenerationRequest(PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True)))
    assert vllm_tied.pause(PauseMode.ABORT) == 1
    vllm_tied.continue_generation()
    out = running.result(timeout=60)
    assert out.finish_reason.name == "ABORT" and len(out.token_ids) < 200
    assert len(greedy(vllm_tied, PROMPTS[0], 4)) == 4


def test_a_refused_load_keeps_the_server_and_the_served_weights(vllm_tied, tied_model, tmp_path):
    before, version = greedy(vllm_tied, PROMPTS[0]), vllm_tied.weight_version
    bad = weights_of(tied_model)
    bad["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(FailedPrecondition, match="model.norm.weight has shape"):
        load(vllm_tied, tied_model, tmp_path / "w", bad)
    assert vllm_tied.health() and vllm_tied.weight_version == version == vllm_tied.served_version()
    assert greedy(vllm_tied, PROMPTS[0]) == before


def group(engine, name, sealed=False, timeout_s=60.0):
    spec = W.GroupSpec("127.0.0.1", free_port(), 2, 0, name, "gloo", timeout_s, "engine", sealed)
    with ThreadPoolExecutor(1) as pool:
        trainer = pool.submit(EngineGroupSender.join, spec)
        assert engine.init_weight_update_group(W.GroupSpec(**{**spec.__dict__, "rank_offset": 1})) == 1
        return trainer.result(timeout=60)


def send(trainer, engine, name, tensors, version):
    """Small buckets, so fused modules (q/k/v, gate/up) arrive split across buckets. The trainer's send must
    succeed when the engine's update does; when the engine refuses, the trainer hears it as an error."""
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(trainer.send, list(tensors.items()), version, bucket_bytes=6_000)
        try:
            result = engine.update_weights_from_distributed(GroupUpdate(name, version, timeout_seconds=60))
        except MeshrlError:
            with contextlib.suppress(Exception):
                sent.result(timeout=60)
            raise
        sent.result(timeout=60)
        return result


def test_updates_over_the_weight_group_and_a_torn_one(vllm_tied, tied_model):
    before = greedy(vllm_tied, PROMPTS[0])
    trainer = group(vllm_tied, "vllm-native")
    try:
        zero = weights_of(tied_model, zero_norm=True)
        version = vllm_tied.weight_version + 1
        result = send(trainer, vllm_tied, "vllm-native", zero, version)
        assert result.version == version == vllm_tied.served_version()
        assert greedy(vllm_tied, PROMPTS[0]) == [0] * 12
        assert vllm_tied.weight_checksums()[1] == W.tensor_checksums(zero)
        torn = weights_of(tied_model)
        del torn["model.layers.1.self_attn.k_proj.weight"]  # q and v arrive, k never: the module stays in part
        with pytest.raises(TornWeights, match="qkv_proj"):
            send(trainer, vllm_tied, "vllm-native", torn, version + 1)
        assert vllm_tied.health() and vllm_tied.served_version() == version  # the version is not claimed
        whole = weights_of(tied_model)
        send(trainer, vllm_tied, "vllm-native", whole, version + 2)
        assert greedy(vllm_tied, PROMPTS[0]) == before
    finally:
        vllm_tied.destroy_weight_update_group("vllm-native")
        trainer.destroy()


def test_prefix_cache_reset_is_read_from_the_reply(vllm_tied):
    assert vllm_tied.flush_cache() is True


def test_sleep_on_the_cpu_build_is_refused_with_the_reason(vllm_tied):
    assert vllm_tied.device == "cpu"
    with pytest.raises(FailedPrecondition, match="frees no memory"):
        vllm_tied.release_memory()


def test_an_untied_model_loads_and_matches_the_trainer(vllm_untied, untied_model, tmp_path):
    engine = vllm_untied
    zero = weights_of(untied_model, zero_norm=True)
    load(engine, untied_model, tmp_path / "w", zero)
    assert greedy(engine, PROMPTS[0]) == [0] * 12
    load(engine, untied_model, tmp_path / "w", weights_of(untied_model))
    result = engine.generate([GenerationRequest(PROMPTS[1], SamplingParams(max_tokens=10, seed=3))])[0]
    want = trainer_logprobs(untied_model, [PROMPTS[1]], [result.token_ids])
    assert np.abs(np.asarray(result.logprobs) - want).max() < 1e-4


def test_a_sealed_weight_group_carries_updates_and_refuses_another_token(vllm_untied, untied_model, monkeypatch):
    """The untied model's server holds the service token (SECRET_ENV): with a sealed group the worker extension
    and the trainer build their backend over the sealed store. A trainer with another token cannot form the
    group with it: both ends refuse what the other sealed, promptly, and the server stays up."""
    monkeypatch.setattr(weight_group_secret, "_secret", GROUP_TOKEN)
    trainer = group(vllm_untied, "vllm-sealed", sealed=True)
    try:
        version = vllm_untied.weight_version + 1
        send(trainer, vllm_untied, "vllm-sealed", weights_of(untied_model, zero_norm=True), version)
        assert greedy(vllm_untied, PROMPTS[0]) == [0] * 12
        send(trainer, vllm_untied, "vllm-sealed", weights_of(untied_model), version + 1)
        assert 0 not in greedy(vllm_untied, PROMPTS[0])
    finally:
        vllm_untied.destroy_weight_update_group("vllm-sealed")
        trainer.destroy()
    monkeypatch.setattr(weight_group_secret, "_secret", "another token")
    start = time.monotonic()
    with pytest.raises(MeshrlError):
        group(vllm_untied, "vllm-stranger", sealed=True, timeout_s=20.0)
    assert time.monotonic() - start < 60 and vllm_untied.health()
