"""meshrl's batch route in a real vLLM 0.32 server (the CPU build): seeded samples of one request equal the same
seeds asked one by one on vLLM's own route, a batch through the adapter equals its requests sent alone, cancelling
one request of a running batch, an abort pause ending one, an update landing mid-batch (paused in place) recorded token by token, and
malformed bodies refused with 400 while the server stays up.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from meshrl.rollout.types import DiskUpdate, FinishReason, GenerationRequest, PauseMode, SamplingParams
from meshrl.rollout.vllm_batch_wire import BATCH_PATH
from tests.integration.vllm.test_vllm_engine import PROMPTS, _versions, greedy, load, publish, weights_of


def params(**kw):
    base = {"n": 1, "max_tokens": 6, "temperature": 1.0, "top_k": 0, "ignore_eos": True, "logprobs": 0}
    return {**base, "detokenize": False, "skip_special_tokens": False, **kw}


def batch_lines(engine, body) -> list[dict]:
    reply = httpx.post(engine.url + BATCH_PATH, json=body, timeout=60)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in reply.text.splitlines()]
    assert lines[-1] == {"done": True}
    return lines


def tokens_route(engine, prompt, seed) -> tuple[list[int], list[float]]:
    """One seeded request on vLLM's own /inference/v1/generate (not streamed)."""
    body = {"token_ids": prompt, "sampling_params": params(seed=seed), "output_mode": "tokens", "stream": False}
    choice = httpx.post(engine.url + "/inference/v1/generate", json=body, timeout=60).json()["choices"][0]
    return choice["token_ids"], [c["logprob"] for c in choice["logprobs"]["content"]]


def test_seeded_samples_of_a_batch_equal_the_same_seeds_asked_alone(vllm_tied):
    """Sample k of a request with n samples and seed s is seeded s + k (vLLM's rule, which meshrl's grouping
    relies on). Short prompts: the CPU build's engine dies rewinding a seeded generator after a chunked
    prefill, which is why the adapter sends no seeds to it."""
    body = {
        "stream_interval": 2,
        "requests": [
            {"id": "seeded-a", "prompt": PROMPTS[0], "params": params(n=3, seed=11)},
            {"id": "seeded-b", "prompt": PROMPTS[1], "params": params(seed=40)},
        ],
    }
    got: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
    for line in batch_lines(vllm_tied, body)[:-1]:
        for item in line["out"]:
            ids, lps = got.setdefault((item["i"], item["k"]), ([], []))
            ids += item["ids"]
            lps += item["lps"]
    assert sorted(got) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    for (i, k), (ids, lps) in got.items():
        want_ids, want_lps = tokens_route(vllm_tied, PROMPTS[i], (11 if i == 0 else 40) + k)
        assert ids == want_ids and lps == pytest.approx(want_lps, abs=1e-6)
    assert len({tuple(got[(0, k)][0]) for k in range(3)}) > 1  # the samples differ


def test_a_batch_through_the_adapter_equals_its_requests_alone(vllm_tied):
    sampling = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    batch = vllm_tied.generate([GenerationRequest(p, sampling) for p in PROMPTS], timeout=60)
    for prompt, result in zip(PROMPTS, batch, strict=True):
        alone = greedy(vllm_tied, prompt)
        assert result.token_ids == alone and result.finish_reason == FinishReason.LENGTH
    sampled = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    results = vllm_tied.generate([GenerationRequest(PROMPTS[0], sampled) for _ in range(4)], timeout=60)
    assert all(len(r.token_ids) == len(r.logprobs) == len(r.weight_versions) == 8 for r in results)


# A batch of 32 times the prompts runs ~4 s on a quiet host (6 waves of the server's 16 sequences; 3 requests
# alone: 0.7 s), so a pause, cancel or update the test sends after the first tokens still finds it running when
# a busy host is slow to schedule the test's own thread.
BUSY_BATCH = PROMPTS * 32


def wait_tokens(engine, more_than: int) -> None:
    deadline = time.monotonic() + 60
    while engine.generated_tokens <= more_than:
        assert time.monotonic() < deadline, "the batch made no token in 60 s"
        time.sleep(0.01)


def test_cancelling_one_request_of_a_running_batch(vllm_tied):
    sampling = SamplingParams(temperature=1.0, max_tokens=200, ignore_eos=True)
    requests = [GenerationRequest(p, sampling) for p in BUSY_BATCH]
    before = vllm_tied.generated_tokens
    futures = vllm_tied.submit_many(requests)
    wait_tokens(vllm_tied, before)
    assert vllm_tied.cancel(requests[-1].request_id)
    cancelled = futures[-1].result(timeout=120)
    assert cancelled.finish_reason == FinishReason.ABORT and len(cancelled.token_ids) < 200
    for future in futures[:-1]:
        result = future.result(timeout=120)
        assert result.finish_reason == FinishReason.LENGTH and len(result.token_ids) == 200


def test_an_abort_pause_ends_a_running_batch_and_generation_goes_on(vllm_tied):
    """The pause ends the requests still running (on a busy host some may have finished first) and counts them."""
    sampling = SamplingParams(temperature=1.0, max_tokens=200, ignore_eos=True)
    before = vllm_tied.generated_tokens
    futures = vllm_tied.submit_many([GenerationRequest(p, sampling) for p in BUSY_BATCH])
    wait_tokens(vllm_tied, before)
    try:
        aborted = vllm_tied.pause(PauseMode.ABORT)
    finally:
        vllm_tied.continue_generation()  # a failed check must not leave the shared server paused
    results = [f.result(timeout=60) for f in futures]
    ended = [r for r in results if r.finish_reason == FinishReason.ABORT]
    assert aborted > 0 and len(ended) == aborted and all(len(r.token_ids) < 200 for r in ended)
    assert all(len(r.token_ids) == 200 for r in results if r.finish_reason != FinishReason.ABORT)
    assert vllm_tied.generate([GenerationRequest(p, SamplingParams(max_tokens=4)) for p in PROMPTS], timeout=60)


def test_an_update_landing_mid_batch_records_each_tokens_version(vllm_tied, tied_model, tmp_path):
    """Paused in place: every request of the batch keeps its KV and goes on with the new weights; vLLM's spans
    say which tokens the old weights made. The test pauses the batch in place itself before the update (whose
    reading and checking of the folder takes long on a busy host, while the batch runs on). When the requests
    running at the pause had all finished before it landed (the first streamed tokens can reach the adapter
    late), the scenario runs again, up to three times, with the old weights back."""
    old = {tuple(p): greedy(vllm_tied, p, 150) for p in PROMPTS}
    landed = 0
    for attempt in range(3):
        root = tmp_path / f"w{attempt}"
        landed = _update_mid_batch(vllm_tied, tied_model, root, old)
        load(vllm_tied, tied_model, root, weights_of(tied_model))
        if landed:
            break
    assert landed, "no request of the batch was running when the update landed"


def _update_mid_batch(engine, tied_model, root, old) -> int:
    """One batch with an update to zeroed weights landing while it runs; checks every request's tokens and
    versions and returns how many requests the update landed in the middle of."""
    version = next(_versions) + engine.weight_version
    zero = publish(tied_model, root, version, weights_of(tied_model, zero_norm=True))
    sampling = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)
    before = engine.generated_tokens
    prompts = BUSY_BATCH
    futures = engine.submit_many([GenerationRequest(p, sampling) for p in prompts])
    wait_tokens(engine, before)
    assert engine.pause(PauseMode.IN_PLACE) == 0
    try:  # the update pauses and continues for itself; the batch goes on once the test's own pause ends too
        engine.update_weights_from_disk(
            DiskUpdate(zero.path, version, zero.manifest_sha256, pause_mode=PauseMode.IN_PLACE, flush_cache=False)
        )
    finally:
        engine.continue_generation()
    landed = 0
    for prompt, future in zip(prompts, futures, strict=True):
        out = future.result(timeout=120)
        assert len(out.token_ids) == 150
        made = sum(v < version for v in out.weight_versions)  # by the old weights (a queued request: none)
        assert len(set(out.weight_versions[:made])) <= 1 and out.weight_versions[made:] == [version] * (150 - made)
        assert out.token_ids[:made] == old[tuple(prompt)][:made]  # the old weights' tokens, under the old version
        assert out.token_ids[made:] == [0] * (150 - made)  # every later token from the new weights
        landed += 0 < made < 150
    return landed


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"{not json", "the body is not JSON"),
        (json.dumps({"requests": 3}).encode(), "must be a JSON object"),
        (json.dumps({"requests": [{"id": "x", "prompt": []}]}).encode(), "prompt must be a non-empty list"),
        (json.dumps({"requests": [{"id": "x", "prompt": [1], "params": {"bogus": 1}}]}).encode(), "'bogus'"),
        (json.dumps({"requests": [{"id": "x", "prompt": [1], "params": {"temperature": -1}}]}).encode(), "temperature"),
        (json.dumps({"stream_interval": -2, "requests": []}).encode(), "stream_interval must be"),
    ],
)
def test_a_malformed_batch_is_refused_and_the_server_stays_up(vllm_tied, body, why):
    reply = httpx.post(
        vllm_tied.url + BATCH_PATH, content=body, headers={"content-type": "application/json"}, timeout=30
    )
    assert reply.status_code == 400 and why in reply.json()["detail"]
    assert vllm_tied.health() and len(greedy(vllm_tied, PROMPTS[0], 4)) == 4
