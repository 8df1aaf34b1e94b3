"""The SGLang and vLLM adapters against fake servers that replay the documented payloads: streamed
tokens, log-probs, finish reasons and weight versions; pause / continue / abort; weight updates from a
published folder; refusals; server flags. The adapters run the same code a GPU host runs (URL mode)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from _rollout_fake_servers import BATCH_PATH, VLLM_RECORDED, FakeSGLang, FakeVLLM, logprob, token
from safetensors.torch import load_file

from meshrl.common import weights as W
from meshrl.common.errors import FailedPrecondition, InvalidArgument
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.http_server import check_known_flags, cli_flags
from meshrl.rollout.sglang_engine import SGLangEngine
from meshrl.rollout.types import DiskUpdate, FinishReason, GenerationRequest, PauseMode, SamplingParams
from meshrl.rollout.vllm_engine import VLLMEngine, with_plugin
from meshrl.rollout.vllm_install import VLLMBuild


def expected(prompt, n):
    return [token(prompt, k) for k in range(n)], [logprob(k) for k in range(n)]


@pytest.fixture
def published(model_dir, tmp_path):
    tensors = sorted(load_file(str(model_dir / "model.safetensors")).items())
    extra = {"config.json": (model_dir / "config.json").read_bytes()}
    return W.write_version(str(tmp_path / "weights"), 1, tensors, extra_files=extra, fsync=False)


@pytest.fixture(params=[False, True], ids=["cumulative", "incremental"])
def sglang(request, model_dir):
    fake = FakeSGLang(incremental=request.param)
    engine = SGLangEngine(EngineConfig(kind="sglang", model_path=str(model_dir), sglang={"url": fake.url}))
    yield fake, engine
    engine.shutdown()
    fake.close()


def test_sglang_generation_payloads(sglang):
    fake, engine = sglang
    prompts = [[1, 2, 3], [4, 5], [9]]
    params = SamplingParams(temperature=0.5, top_p=0.9, top_k=0, max_tokens=6, seed=7, stop_token_ids=(250,))
    results = engine.generate([GenerationRequest(p, params) for p in prompts])
    for prompt, result in zip(prompts, results):
        ids, lps = expected(prompt, 6)
        assert result.token_ids == ids and result.logprobs == pytest.approx(lps)
        assert result.finish_reason == FinishReason.LENGTH and result.weight_versions == [0] * 6
    body = fake.calls("/generate")[0]
    assert body["return_logprob"] is True and body["stream"] is True and body["input_ids"] in prompts
    sp = body["sampling_params"]
    assert sp["max_new_tokens"] == 6 and sp["temperature"] == 0.5 and sp["top_k"] == -1
    assert sp["sampling_seed"] == 7 and sp["stop_token_ids"] == [250] and sp["no_stop_trim"] is True
    stop_at = token([1, 2, 3], 2)
    stopped = engine.generate([GenerationRequest([1, 2, 3], SamplingParams(max_tokens=6, stop_token_ids=(stop_at,)))])[
        0
    ]
    assert stopped.finish_reason == FinishReason.STOP and stopped.token_ids[-1] == stop_at
    status = engine.status()
    assert status.engine == "sglang" and status.generated_tokens == 21 and status.healthy


def test_sglang_weight_update_from_disk_pauses_in_place_and_stamps_the_version(sglang, published):
    fake, engine = sglang
    running = engine.submit(GenerationRequest([1, 2], SamplingParams(max_tokens=40)))
    time.sleep(0.1)
    result = engine.update_weights_from_disk(DiskUpdate(published.path, 1, manifest_sha256=published.manifest_sha256))
    assert result.version == 1 and engine.weight_version == 1
    out = running.result(timeout=30)
    assert out.weight_versions[0] == 0 and out.weight_versions[-1] == 1 and len(out.token_ids) == 40
    update = fake.calls("/update_weights_from_disk")[0]
    assert update["model_path"] == published.path and update["weight_version"] == "1"
    assert update["abort_all_requests"] is False
    order = [
        p
        for _, p, _ in fake.requests
        if p in ("/pause_generation", "/update_weights_from_disk", "/continue_generation")
    ]
    assert order == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
    assert fake.calls("/pause_generation")[0] == {"mode": "in_place"}
    version, sums = engine.weight_checksums(["model.norm.weight"])
    assert version == 1 and len(sums["model.norm.weight"]) == 64


def test_sglang_refusals_keep_the_old_version(sglang, published, tmp_path):
    fake, engine = sglang
    with pytest.raises(InvalidArgument, match="older|announced"):
        engine.update_weights_from_disk(DiskUpdate(published.path, 3))
    bad = tmp_path / "bad" / "v000001"
    bad.parent.mkdir()
    import shutil

    shutil.copytree(published.path, bad)
    with pytest.raises(InvalidArgument, match="shape mismatch"):
        engine.update_weights_from_disk(DiskUpdate(str(bad), 1))
    assert engine.weight_version == 0
    assert fake.calls("/continue_generation")  # generation resumed after the refusal


def test_sglang_abort_pause(sglang):
    fake, engine = sglang
    running = engine.submit(GenerationRequest([3], SamplingParams(max_tokens=200)))
    time.sleep(0.1)
    assert engine.pause(PauseMode.ABORT) == 1
    assert running.result(timeout=30).finish_reason == FinishReason.ABORT
    fake.aborted.clear()
    engine.continue_generation()
    assert (
        engine.generate([GenerationRequest([3], SamplingParams(max_tokens=2))])[0].finish_reason == FinishReason.LENGTH
    )


@pytest.fixture
def vllm(model_dir):
    """A vLLM server with meshrl's endpoint plugin: batches go to its batch route."""
    fake = FakeVLLM()
    engine = VLLMEngine(EngineConfig(kind="vllm", model_path=str(model_dir), vllm={"url": fake.url}))
    yield fake, engine
    engine.shutdown()
    fake.close()


@pytest.fixture
def vllm_plain(model_dir):
    """A vLLM server without meshrl's endpoint plugin (given by URL): each request streams on its own."""
    fake = FakeVLLM(plugin=False)
    engine = VLLMEngine(EngineConfig(kind="vllm", model_path=str(model_dir), vllm={"url": fake.url}))
    yield fake, engine
    engine.shutdown()
    fake.close()


def test_vllm_generation_payloads(vllm):
    fake, engine = vllm
    result = engine.generate([GenerationRequest([7, 8], SamplingParams(temperature=0, max_tokens=5))])[0]
    ids, lps = expected([7, 8], 5)
    assert result.token_ids == ids and result.logprobs == pytest.approx(lps)
    assert result.finish_reason == FinishReason.LENGTH and result.weight_versions == [0] * 5
    body = fake.calls(BATCH_PATH)[0]
    assert body["stream_interval"] == 16 and [r["prompt"] for r in body["requests"]] == [[7, 8]]
    params = body["requests"][0]["params"]
    assert body["requests"][0]["id"] == result.request_id and params["n"] == 1 and params["max_tokens"] == 5
    assert params["logprobs"] == 0 and params["detokenize"] is False and params["top_k"] == 0
    assert not fake.calls("/inference/v1/generate")


def test_vllm_without_the_batch_route_streams_each_request(vllm_plain):
    fake, engine = vllm_plain
    results = engine.generate([GenerationRequest([7, 8], SamplingParams(max_tokens=5)) for _ in range(2)])
    assert [r.token_ids for r in results] == [[(t + i) % 200 for t in expected([7, 8], 5)[0]] for i in range(2)]
    assert all(r.weight_versions == [0] * 5 and r.finish_reason == FinishReason.LENGTH for r in results)
    body = fake.calls("/inference/v1/generate")[0]
    params = body["sampling_params"]
    assert body["token_ids"] == [7, 8] and body["stream"] is True and body["output_mode"] == "tokens"
    assert params["logprobs"] == 0 and params["detokenize"] is False and params["n"] == 2
    assert params["stream_interval"] == 16 and not fake.calls(BATCH_PATH)


def test_a_launched_vllm_server_without_meshrls_plugin_is_refused(model_dir, monkeypatch):
    """A launched server must have loaded the batch route; the error names the version and the fix."""
    fake = FakeVLLM(plugin=False)
    stopped = []
    server = SimpleNamespace(alive=lambda: True, stop=lambda: stopped.append(True))
    monkeypatch.setattr("meshrl.rollout.vllm_engine.ServerProcess", lambda cmd, **kw: server)
    monkeypatch.setattr("meshrl.rollout.vllm_engine.installed_build", lambda python: VLLMBuild("vllm", "0.32.0"))
    port = int(fake.url.rsplit(":", 1)[1])
    try:
        with pytest.raises(FailedPrecondition, match=r"vllm 0\.32\.0 server .* no meshrl batch route.*VLLM_PLUGINS"):
            VLLMEngine(EngineConfig(kind="vllm", model_path=str(model_dir), vllm={"port": port}))
        assert stopped
    finally:
        fake.close()


def test_vllm_plugin_list_for_the_launched_server(monkeypatch):
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert with_plugin(None) == "meshrl"
    assert with_plugin("lora_filesystem_resolver") == "lora_filesystem_resolver,meshrl"
    assert with_plugin("meshrl,x") == "meshrl,x"
    monkeypatch.setenv("VLLM_PLUGINS", "x")
    assert with_plugin(None) == "x,meshrl"


def test_vllm_gpu_server_facts_and_versions(vllm):
    """Read from the server at start: its version (0.32+), its device, the weight version it serves."""
    fake, engine = vllm
    assert engine.device == "cuda" and engine.weight_version == 0  # "default" before any update
    engine.set_served_version(3)
    assert engine.weight_version == 3 and fake.served == "3"


def test_vllm_prefix_cache_reset_is_read_from_the_body(vllm, monkeypatch):
    """vLLM answers 200 with {"success": false} while blocks are held (recorded): that is not a reset."""
    fake, engine = vllm
    assert engine.flush_cache() is True
    monkeypatch.setitem(VLLM_RECORDED, "/reset_prefix_cache", {"success": False})
    assert engine.flush_cache() is False
    assert fake.queries[-1] == ("/reset_prefix_cache", "reset_running_requests=true")


def test_vllm_refuses_a_server_older_than_0_32(model_dir, monkeypatch):
    fake = FakeVLLM()
    monkeypatch.setitem(VLLM_RECORDED, "/version", {"version": "0.11.0"})
    try:
        with pytest.raises(FailedPrecondition, match="0.32 or newer"):
            VLLMEngine(EngineConfig(kind="vllm", model_path=str(model_dir), vllm={"url": fake.url}))
    finally:
        fake.close()


def test_server_flags():
    assert cli_flags({"tp_size": 2, "trust_remote_code": True, "enable_x": False, "dp": [1, 2]}) == [
        "--tp-size",
        "2",
        "--trust-remote-code",
        "--dp",
        "1",
        "2",
    ]
    with pytest.raises(InvalidArgument, match="did you mean 'tp_size'"):
        check_known_flags({"tp_sise": 2}, ["tp_size", "mem_fraction_static"], "sglang")
    with pytest.raises(InvalidArgument, match="flag name"):
        cli_flags({"bad key!": 1})


def test_vllm_samples_of_a_prompt_share_one_request(vllm):
    """A batch goes as one call; the samples of a prompt in it as one request with n (recorded 0.32 lines:
    several requests' items each, chunks of stream_interval tokens); each sample still gets its own tokens,
    log-probs and versions, and its future completes when it finishes."""
    fake, engine = vllm
    sampling = SamplingParams(max_tokens=20, ignore_eos=True)
    requests = [GenerationRequest([7, 8], sampling) for _ in range(3)] + [GenerationRequest([9], sampling)]
    results = engine.generate(requests, timeout=30)
    for i, result in enumerate(results[:3]):
        ids, lps = expected([7, 8], 20)
        assert result.token_ids == [(t + i) % 200 for t in ids] and result.logprobs == pytest.approx(lps)
        assert result.weight_versions == [0] * 20 and result.finish_reason == FinishReason.LENGTH
    assert results[3].token_ids == expected([9], 20)[0]
    (call,) = fake.calls(BATCH_PATH)
    assert [r["params"]["n"] for r in call["requests"]] == [3, 1] and call["stream_interval"] == 16
    assert call["requests"][0]["id"] == requests[0].request_id
    assert not fake.calls("/inference/v1/generate")


def test_vllm_a_request_the_batch_route_fails_fails_alone(vllm):
    """The server's error item for one request (recorded: a token outside its vocabulary) fails that request."""
    fake, engine = vllm
    futures = engine.submit_many(
        [GenerationRequest([250], SamplingParams(max_tokens=4)), GenerationRequest([9], SamplingParams(max_tokens=4))]
    )
    with pytest.raises(InvalidArgument, match="out of vocabulary"):
        futures[0].result(timeout=30)
    assert futures[1].result(timeout=30).token_ids == expected([9], 4)[0]
    assert engine.status().running_requests == 0


def test_vllm_a_refused_batch_fails_its_requests_with_the_servers_reason(vllm, monkeypatch):
    fake, engine = vllm
    fields = engine.sampling_fields
    monkeypatch.setattr(engine, "sampling_fields", lambda *a: {**fields(*a), "bogus": 1})
    futures = engine.submit_many([GenerationRequest([7], SamplingParams(max_tokens=4)) for _ in range(2)])
    for future in futures:
        with pytest.raises(InvalidArgument, match="Unexpected keyword argument 'bogus'"):
            future.result(timeout=30)


def test_vllm_a_request_read_live_streams_every_token(vllm):
    fake, engine = vllm
    chunks = list(engine.stream(GenerationRequest([7, 8], SamplingParams(max_tokens=4, ignore_eos=True))))
    assert [c.token_ids for c in chunks[:4]] == [[t] for t in expected([7, 8], 4)[0]]
    assert "stream_interval" not in fake.calls("/inference/v1/generate")[0]["sampling_params"]


def test_vllm_samples_a_shared_request_did_not_finish_go_on_alone(vllm):
    """A server that answers only the first sample of a shared request: the others are generated on their own."""
    fake, engine = vllm
    fake.honour_n = False
    results = engine.generate([GenerationRequest([7, 8], SamplingParams(max_tokens=6)) for _ in range(3)], timeout=30)
    assert all(r.token_ids == expected([7, 8], 6)[0] and r.finish_reason == FinishReason.LENGTH for r in results)
    assert [r["params"]["n"] for c in fake.calls(BATCH_PATH) for r in c["requests"]] == [3]
    assert [c["sampling_params"]["n"] for c in fake.calls("/inference/v1/generate")] == [1, 1]


def wait_for(fake, path):
    deadline = time.monotonic() + 10
    while not fake.calls(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_vllm_cancelling_one_shared_sample_leaves_the_others(vllm):
    fake, engine = vllm
    requests = [GenerationRequest([7, 8], SamplingParams(max_tokens=60, ignore_eos=True)) for _ in range(3)]
    futures = engine.submit_many(requests)
    wait_for(fake, BATCH_PATH)
    assert engine.cancel(requests[1].request_id)
    results = [f.result(timeout=30) for f in futures]
    assert [r.finish_reason for r in results] == [FinishReason.LENGTH, FinishReason.ABORT, FinishReason.LENGTH]
    assert len(results[0].token_ids) == len(results[2].token_ids) == 60 and len(results[1].token_ids) < 60
    assert not fake.calls("/inference/v1/abort_requests")  # the server request goes on for the other samples


def test_vllm_cancelling_one_request_of_a_batch_aborts_it_on_the_server(vllm):
    fake, engine = vllm
    requests = [GenerationRequest([p], SamplingParams(max_tokens=80, ignore_eos=True)) for p in (3, 4, 5)]
    futures = engine.submit_many(requests)
    wait_for(fake, BATCH_PATH)
    time.sleep(0.05)
    assert engine.cancel(requests[1].request_id)
    cancelled = futures[1].result(timeout=30)
    assert cancelled.finish_reason == FinishReason.ABORT and len(cancelled.token_ids) < 80
    assert not futures[0].done()  # it ended before the batch did
    assert {"request_ids": [requests[1].request_id]} in fake.calls("/inference/v1/abort_requests")
    assert all(f.result(timeout=30).finish_reason == FinishReason.LENGTH for f in (futures[0], futures[2]))


def test_vllm_a_batch_with_a_repeated_request_id_queues_none_of_it(vllm):
    fake, engine = vllm
    first = GenerationRequest([7, 8], SamplingParams(max_tokens=3))
    again = GenerationRequest([7, 8], SamplingParams(max_tokens=3), request_id=first.request_id)
    with pytest.raises(InvalidArgument, match="already running"):
        engine.submit_many([first, GenerationRequest([9], SamplingParams(max_tokens=3)), again])
    assert engine.status().running_requests == 0 and not fake.calls(BATCH_PATH)
