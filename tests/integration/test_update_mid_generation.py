"""Partial rollout through the real services: a data buffer, a trainer (megatron-core) and a rollout replica
(transformers engine), each its own process. A weight version published on disk by the trainer lands while a
long batch is being generated. Three things are checked on that one batch:
- its samples carry tokens of two versions, and each token's version is recorded (`response_versions`);
- the tokens generated after the update have the trainer's log-probs, and the tokens generated before it
  do not (their rollout log-probs come from the old policy);
- the trainer's decoupled-PPO importance weights (TIS truncation, MIS masking) equal those computed from
  those rollout log-probs, token by token.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.scheduler.clients import RolloutClient, TrainerClient
from meshrl.scheduler.config import OptimSection, WeightsSection
from meshrl.scheduler.fleet.router import RolloutRouter
from meshrl.scheduler.fleet.weight_sync import WeightPublisher
from meshrl.scheduler.launch.launcher import ProcessLauncher, ServiceSpec

PROMPTS, N = 2, 2
LONG = 400  # tokens per sample of the batch the update lands in (a random model does not stop early)
JOB = "midgen"


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    from meshrl.trainer.model_builder import build_small_model

    root = tmp_path_factory.mktemp("midgen")
    model = str(build_small_model(root / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1))
    launcher = ProcessLauncher(root / "logs", start_timeout=120)
    try:
        buffer = launcher.start(
            [ServiceSpec("databuffer", "databuffer", ["--set", f"redis.embedded.data_dir={root}/r"])]
        )["databuffer"]
        with_buffer = ["--set", f"databuffer_address={buffer}", "--set", f"paths.roots={json.dumps([str(root)])}"]
        addresses = launcher.start(
            [
                ServiceSpec("trainer", "trainer", with_buffer),
                ServiceSpec("rollout", "rollout-0", [*with_buffer, "--set", f"engine.model_path={model}"]),
            ]
        )
        trainer = TrainerClient(addresses["trainer"])
        trainer.load_model("actor", model, "float32", OptimSection(lr=1e-2), 0)
        replica = RolloutClient(addresses["rollout-0"])
        client = DataBufferClient(buffer)
        router = RolloutRouter(addresses=[replica.address], databuffer=client)
        yield {"trainer": trainer, "replica": replica, "buffer": client, "router": router, "root": root}
        router.close()
        client.close()
    finally:
        launcher.stop_all(grace=5)


def _generate(s, step: int, max_tokens: int):
    source = batch_key(JOB, step, "data_load")
    prompts = [np.array([3, 1, 4, 1, 5], np.int32), np.array([2, 7, 1, 8], np.int32)]
    s["buffer"].put(source, {S.PROMPT_IDS: Ragged.from_rows(prompts, dtype=np.int32)})
    out = batch_key(JOB, step, "rollout")
    sampling = {"temperature": 1.0, "max_tokens": max_tokens, "ignore_eos": True, "seed": step}
    s["router"].generate_batch(source, out, sampling, n=N, job_id=JOB, step=step, num_prompts=PROMPTS)
    return out


def _prepare(s, step: int, rollout) -> tuple[list, dict]:
    """Old log-probs (the trainer's, before any update) and random advantages beside the rollout's rows;
    returns (the train step's input keys, the per-token columns it will read)."""
    old = batch_key(JOB, step, "old_logprob")
    s["trainer"].compute_logprobs("actor", [rollout], old, S.OLD_LOGPROBS, False)
    batch = s["buffer"].get_many([rollout, old])
    rng = np.random.default_rng(step)
    lengths = [len(r) for r in batch[S.RESPONSE_IDS].rows()]
    adv = batch_key(JOB, step, "advantage")
    s["buffer"].put(adv, {S.ADVANTAGES: Ragged.from_rows([np.full(n, rng.normal(), np.float32) for n in lengths])})
    return [rollout, old, adv], {c: batch[c].values for c in (S.OLD_LOGPROBS, S.ROLLOUT_LOGPROBS, S.RESPONSE_VERSIONS)}


def _train(s, step: int, keys: list, loss: dict) -> dict:
    loss = {"kl_coef": 0.0, "entropy_coef": 0.0, **loss}
    reply = s["trainer"].train_step("actor", keys, loss, micro_batch_tokens=4096, mini_batches=1, step=step)
    return dict(reply.metrics)


def test_an_update_mid_generation_versions_each_token_and_the_loss_weights_them_by_rollout_logprobs(services, capsys):
    s = services
    cfg = WeightsSection(transport="disk", pause_mode="in_place", timeout_seconds=60)
    publisher = WeightPublisher(s["trainer"], cfg, str(s["root"] / "weights"))
    publisher.version = s["replica"].status().weight_version
    v1 = publisher.publish([s["replica"]]).version  # the replica serves the trainer's weights
    _train(s, 1, _prepare(s, 1, _generate(s, 1, max_tokens=8))[0], {})  # the trainer's weights move on

    holder: dict = {}
    thread = threading.Thread(target=lambda: holder.update(key=_generate(s, 2, LONG)))
    thread.start()
    before = s["replica"].status().generated_tokens
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # publish once the long batch has tokens of the old version
        status = s["replica"].status()
        if status.running_requests > 0 and status.generated_tokens >= before + 4 * PROMPTS * N:
            break
        time.sleep(0.005)
    v2 = publisher.publish([s["replica"]]).version
    thread.join(timeout=300)
    assert "key" in holder, "the long batch did not complete"

    # 1. Two versions per sample, one per token, in order: old tokens, then new ones.
    batch = s["buffer"].get(holder["key"])
    for ids, versions in zip(batch[S.RESPONSE_IDS].rows(), batch[S.RESPONSE_VERSIONS].rows()):
        assert len(versions) == len(ids) == LONG
        assert versions[0] == v1 and versions[-1] == v2 and list(versions) == sorted(versions)
        assert set(versions.tolist()) == {v1, v2}

    # 2. The trainer (at v2) agrees with the rollout's log-probs on v2 tokens, not on v1 tokens.
    keys, cols = _prepare(s, 2, holder["key"])
    old, rollout, versions = cols[S.OLD_LOGPROBS], cols[S.ROLLOUT_LOGPROBS], cols[S.RESPONSE_VERSIONS]
    gap = np.abs(old - rollout)
    assert gap[versions == v2].max() < 1e-3
    assert gap[versions == v1].mean() > 10 * max(gap[versions == v2].mean(), 1e-6)

    # 3. The importance weights the loss used are those of the rollout log-probs, token by token.
    ratio = np.exp((old - rollout).astype(np.float32))
    tis_cap, mis_cap = (float(np.quantile(ratio[versions == v1], q)) for q in (0.5, 0.9))
    expected = np.where(ratio <= mis_cap, np.minimum(ratio, tis_cap), 0.0)
    assert 0 < (expected == 0).mean() < 1 and (expected < ratio).any()  # some truncated, some masked
    metrics = _train(s, 2, keys, {"tis_cap": tis_cap, "mis_cap": mis_cap})
    with capsys.disabled():
        print(
            f"\n\nmid-generation update: tokens of v{v1} {(versions == v1).mean():.2f}, of v{v2} "
            f"{(versions == v2).mean():.2f}; |trainer - rollout| log-prob: v{v1} {gap[versions == v1].mean():.4f}, "
            f"v{v2} {gap[versions == v2].mean():.2e}; tis_weight {metrics['tis_weight']:.5f} (expected "
            f"{expected.mean():.5f}), masked {metrics['is_masked_fraction']:.4f}\n"
        )
    assert metrics["tis_weight"] == pytest.approx(float(expected.mean()), rel=1e-5)
    assert metrics["is_masked_fraction"] == pytest.approx(float((expected == 0).mean()), abs=1e-7)
