"""The transformers engine: greedy parity with `generate`, log-prob parity with a teacher-forced pass,
continuous batching, stop conditions, seeds, prefix reuse, pause / cancel / flush."""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from meshrl.common.errors import InvalidArgument
from meshrl.rollout.types import FinishReason, GenerationRequest, PauseMode, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=20)


@pytest.fixture(scope="module")
def reference(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model


def prompts(count: int, vocab: int = 260, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 24, (count,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def teacher_forced(model, prompt: list[int], response: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]
    return logprobs.gather(1, torch.tensor(response)[:, None])[:, 0]


def test_greedy_equals_hf_generate_and_logprobs_match_teacher_forcing(engine, reference):
    batch = prompts(10)
    results = engine.generate([GenerationRequest(p, GREEDY) for p in batch])  # decoded together
    for prompt, result in zip(batch, results):
        expected = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20)[0, len(prompt) :]
        assert result.token_ids == expected.tolist()
        lp = teacher_forced(reference, prompt, result.token_ids)
        assert torch.allclose(torch.tensor(result.logprobs), lp, atol=1e-4)
        assert result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        assert result.weight_versions == [0] * len(result.token_ids)


def test_sampled_logprobs_are_those_of_the_temperature_scaled_distribution(engine, reference):
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=40, max_tokens=16, seed=11)
    batch = prompts(4, seed=1)
    results = engine.generate([GenerationRequest(p, params) for p in batch])
    for prompt, result in zip(batch, results):
        lp = teacher_forced(reference, prompt, result.token_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(result.logprobs), lp, atol=1e-4)


def test_requests_join_a_running_batch_and_keep_parity(engine, reference):
    first = prompts(3, seed=2)
    later = prompts(3, seed=3)
    long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    early = [engine.submit(GenerationRequest(p, long)) for p in first]
    time.sleep(0.05)  # the first batch is decoding
    joined = [engine.submit(GenerationRequest(p, GREEDY)) for p in later]
    for prompt, fut, n in [(p, f, 40) for p, f in zip(first, early)] + [(p, f, 20) for p, f in zip(later, joined)]:
        result = fut.result(timeout=60)
        expected = reference.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=n, **({"eos_token_id": None} if n == 40 else {})
        )[0, len(prompt) :]
        assert result.token_ids == expected.tolist()


def test_stop_tokens_max_tokens_and_context_length(engine):
    prompt = prompts(1, seed=4)[0]
    free = engine.generate([GenerationRequest(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))])[
        0
    ]
    assert free.finish_reason == FinishReason.LENGTH and len(free.token_ids) == 12
    stop_at = free.token_ids[5]
    stopped = engine.generate(
        [GenerationRequest(prompt, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop_at,)))]
    )[0]
    assert stopped.finish_reason == FinishReason.STOP
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]
    near_limit = list(range(engine.context_length - 3))
    capped = engine.generate(
        [GenerationRequest(near_limit, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))]
    )
    assert capped[0].finish_reason == FinishReason.LENGTH and len(capped[0].token_ids) == 3


def test_seeded_sampling_is_reproducible_and_samples_differ(engine):
    prompt = prompts(1, seed=5)[0]
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=1234, ignore_eos=True)
    a = engine.generate([GenerationRequest(prompt, params)])[0]
    b = engine.generate([GenerationRequest(prompt, params)])[0]
    c = engine.generate([GenerationRequest(prompt, params.with_seed(99))])[0]
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_group_samples_prefill_their_prompt_once(engine, reference, monkeypatch):
    prompt = prompts(1, seed=6)[0] + [1, 2, 3]
    prefilled: list[tuple[int, ...]] = []
    original = engine.runner.prefill_many

    def spy(batch):
        prefilled.extend(tuple(p) for p in batch)
        return original(batch)

    monkeypatch.setattr(engine.runner, "prefill_many", spy)
    results = engine.generate([GenerationRequest(prompt, GREEDY) for _ in range(4)])
    again = engine.generate([GenerationRequest(prompt, GREEDY)])[0]  # from the prefix cache
    assert prefilled.count(tuple(prompt)) == 1
    assert all(r.token_ids == results[0].token_ids for r in [*results, again])
    expected = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20)[0, len(prompt) :]
    assert results[0].token_ids == expected.tolist()


def test_next_turn_of_a_session_reuses_the_conversation_kv(engine, reference):
    turn1 = prompts(1, seed=8)[0]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    first = engine.generate([GenerationRequest(turn1, params, session_id="chat-1")])[0]
    turn2 = turn1 + first.token_ids + [5, 6, 7]
    before = engine.batcher.prefix.hits
    second = engine.generate([GenerationRequest(turn2, params, session_id="chat-1")])[0]
    assert engine.batcher.prefix.hits == before + 1
    expected = reference.generate(torch.tensor([turn2]), do_sample=False, max_new_tokens=8, eos_token_id=None)
    assert second.token_ids == expected[0, len(turn2) :].tolist()
    lp = teacher_forced(reference, turn2, second.token_ids)
    assert torch.allclose(torch.tensor(second.logprobs), lp, atol=1e-4)


def test_stream_yields_every_token_then_the_finish(engine):
    prompt = prompts(1, seed=9)[0]
    chunks = list(
        engine.stream(GenerationRequest(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)))
    )
    tokens = [t for c in chunks for t in c.token_ids]
    assert len(tokens) == 6 and chunks[-1].finish_reason == FinishReason.LENGTH
    assert (
        tokens
        == engine.generate([GenerationRequest(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))])[
            0
        ].token_ids
    )


def test_pause_in_place_keeps_requests_and_abort_ends_them(engine):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.pause(PauseMode.IN_PLACE)
    try:
        held = engine.submit(GenerationRequest(prompts(1, seed=10)[0], params))
        time.sleep(0.2)
        assert not held.done() and engine.status().paused
    finally:
        engine.continue_generation()
    assert len(held.result(timeout=60).token_ids) == 30
    running = engine.submit(
        GenerationRequest(prompts(1, seed=11)[0], SamplingParams(temperature=0, max_tokens=500, ignore_eos=True))
    )
    try:  # at once: the request is queued or decoding (after a sleep it could have finished)
        assert engine.pause(PauseMode.ABORT) >= 1
    finally:
        engine.continue_generation()  # a failure here must not leave the shared engine paused
    aborted = running.result(timeout=60)
    assert aborted.finish_reason in (FinishReason.ABORT, FinishReason.LENGTH)


def test_cancel_and_flush(engine, reference):
    long = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    prompt = prompts(1, seed=12)[0]
    fut = engine.submit(GenerationRequest(prompt, long, request_id="cancel-me"))
    assert engine.cancel("cancel-me")  # at once: queued or decoding, not finished
    assert fut.result(timeout=30).finish_reason == FinishReason.ABORT
    assert not engine.cancel("cancel-me")
    # A flush mid-generation recomputes the running rows' KV: the output is unchanged.
    fut = engine.submit(GenerationRequest(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)))
    stop = threading.Event()

    def flusher():
        while not stop.is_set() and not fut.done():
            engine.flush_cache()
            time.sleep(0.02)

    thread = threading.Thread(target=flusher)
    thread.start()
    result = fut.result(timeout=60)
    stop.set()
    thread.join()
    expected = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=30, eos_token_id=None)
    assert result.token_ids == expected[0, len(prompt) :].tolist()


def test_status_counts_tokens(engine):
    before = engine.status().generated_tokens
    engine.generate([GenerationRequest([1, 2, 3], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))])
    status = engine.status()
    assert status.generated_tokens == before + 5
    assert status.engine == "transformers" and status.healthy and status.tokens_per_second > 0


def test_a_batch_generated_together_is_prefilled_in_one_pass(engine, monkeypatch):
    """All requests of one `generate` are queued at once, so they join the same step: one prefill of every
    prompt, not a first request prefilled (and decoded) alone while the others are still being queued.
    A tiny GIL switch interval gives the batcher thread every chance to start between two submissions."""
    calls: list[int] = []
    original = engine.runner.prefill_many

    def spy(group):
        calls.append(len(group))
        return original(group)

    monkeypatch.setattr(engine.runner, "prefill_many", spy)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for seed in range(5):
            engine.flush_cache()  # no prompt of an earlier round is reused
            batch = [[5, seed, *p] for p in prompts(8, seed=20 + seed)]
            engine.generate([GenerationRequest(p, SamplingParams(temperature=1.0, max_tokens=2)) for p in batch])
    finally:
        sys.setswitchinterval(interval)
    assert calls == [8] * 5


def test_a_bad_request_in_a_batch_queues_none_of_it(engine):
    """submit_many checks every request first: one bad request is refused with the reason, and the good ones
    before it are not left running (nothing is generated for a call that failed)."""
    good = GenerationRequest([1, 2, 3], SamplingParams(max_tokens=50))
    bad = GenerationRequest([1, 10**6], SamplingParams(max_tokens=50))
    with pytest.raises(InvalidArgument, match="outside the model's vocabulary"):
        engine.submit_many([good, good, bad])
    assert engine.batcher.queue_depth == 0 and engine.batcher.running == 0
