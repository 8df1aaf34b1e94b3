"""TrainerCore in-process: log-probs vs transformers, train steps, errors, critic, checkpoints, data parallel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _worker import LOSS, make_batch, run_steps
from transformers import AutoModelForCausalLM

from meshrl.common.codec import Ragged
from meshrl.common.errors import DataLoss, FailedPrecondition, InvalidArgument
from meshrl.trainer.core import NonFiniteLoss, TrainerCore
from meshrl.trainer.losses import LossConfig
from meshrl.trainer.optim import OptimizerConfig

WORKER = str(Path(__file__).parent / "_worker.py")


@pytest.fixture()
def core(qwen2_dir):
    core = TrainerCore(micro_batch_tokens=4096)
    core.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2))
    return core


def _params(core, role="actor"):
    return {n: p.detach().clone() for n, p in core.role(role).model.named_parameters()}


def test_logprobs_and_entropy_match_transformers(core, qwen2_dir):
    batch = make_batch(core.role("actor").spec.vocab_size)
    result = core.compute_logprobs("actor", batch, with_entropy=True, micro_batch_tokens=24)
    assert result.micro_batches > 1 and result.tokens == batch["response_ids"].offsets[-1]
    hf = AutoModelForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32).eval()
    prompts, responses = batch["prompt_ids"], batch["response_ids"]
    for i in range(len(prompts)):
        ids = torch.from_numpy(np.concatenate([prompts.row(i), responses.row(i)])).long()[None]
        with torch.no_grad():
            logp = torch.log_softmax(hf(ids).logits[0].float(), -1)
        p = len(prompts.row(i))
        expected = logp[p - 1 : -1].gather(-1, ids[0, p:, None])[:, 0]
        entropy = -(logp.exp() * logp).sum(-1)[p - 1 : -1]
        assert np.abs(result.values.row(i) - expected.numpy()).max() <= 1e-4
        assert np.abs(result.entropy.row(i) - entropy.numpy()).max() <= 1e-4
    # micro-batching does not change the result
    whole = core.compute_logprobs("actor", batch, micro_batch_tokens=100_000)
    np.testing.assert_allclose(whole.values.values, result.values.values, atol=1e-5)
    # temperature divides the logits
    hot = core.compute_logprobs("actor", batch, temperature=2.0)
    assert not np.allclose(hot.values.values, whole.values.values)


def test_ppo_step_lowers_the_loss(core):
    batch = make_batch(core.role("actor").spec.vocab_size)
    batch["old_logprobs"] = core.compute_logprobs("actor", batch).values
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    first = core.train_step("actor", batch, cfg, micro_batch_tokens=24)
    for _ in range(3):
        last = core.train_step("actor", batch, cfg, micro_batch_tokens=24)
    assert last.metrics["loss"] < first.metrics["loss"] - 1e-3
    assert first.optimizer_steps == 1 and first.tokens == batch["response_ids"].offsets[-1]
    assert first.metrics["lr"] == pytest.approx(5e-4) and last.metrics["lr"] == pytest.approx(1e-3)  # warmup
    assert first.metrics["clip_fraction"] == 0.0 and first.metrics["ratio"] == pytest.approx(1.0)
    assert 0.0 <= first.metrics["padding_fraction"] < 0.5
    assert core.role("actor").train_steps == 4


def test_pi_old_from_the_rollout_reads_rollout_logprobs(core, qwen2_dir):
    """old_logprobs = 'rollout': the ratio is taken against the rollout_logprobs column, exactly as a recompute
    step with those values as old_logprobs, and no old_logprobs column is needed."""
    batch = make_batch(core.role("actor").spec.vocab_size)
    behaviour = batch.pop("old_logprobs")
    recompute = TrainerCore(micro_batch_tokens=4096)
    recompute.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2))
    loss = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.0)
    with pytest.raises(InvalidArgument, match="no column 'rollout_logprobs'"):
        core.train_step("actor", batch, LossConfig(old_logprobs="rollout", **loss))
    got = core.train_step("actor", dict(batch, rollout_logprobs=behaviour), LossConfig(old_logprobs="rollout", **loss))
    want = recompute.train_step("actor", dict(batch, old_logprobs=behaviour), LossConfig(**loss))
    assert got.metrics["clip_fraction"] > 0  # the behaviour log-probs are far from the model's: the ratio clips
    for key in ("loss", "pg_loss", "clip_fraction", "ratio", "grad_norm"):
        assert got.metrics[key] == pytest.approx(want.metrics[key], rel=1e-6, abs=1e-7), key


def test_pi_old_in_train_is_the_recomputed_pass(core, qwen2_dir):
    """old_logprobs = 'in-train': the train call computes pi_old with the weights it starts from, before its first
    mini-batch update; the same metrics as a recompute call given that pass's log-probs as old_logprobs, with
    TIS weighed against the rollout's log-probs and a second mini-batch whose ratio is no longer 1."""
    batch = make_batch(core.role("actor").spec.vocab_size)
    behaviour = batch.pop("old_logprobs")
    recompute = TrainerCore(micro_batch_tokens=4096)
    recompute.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2))
    loss = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.0, tis_cap=2.0)
    rows = dict(batch, rollout_logprobs=behaviour)
    pi_old = recompute.compute_logprobs("actor", rows).values
    want = recompute.train_step("actor", dict(rows, old_logprobs=pi_old), LossConfig(**loss), mini_batches=2)
    got = core.train_step("actor", rows, LossConfig(old_logprobs="in-train", **loss), mini_batches=2)
    np.testing.assert_array_equal(got.old_logprobs.values, pi_old.values)
    assert got.metrics["perf/old_logprob_seconds"] > 0 and got.metrics["tis_weight"] != pytest.approx(1.0)
    for key in ("loss", "pg_loss", "clip_fraction", "ratio", "tis_weight", "grad_norm"):
        assert got.metrics[key] == pytest.approx(want.metrics[key], rel=1e-6, abs=1e-7), key
    for name, param in core.role("actor").model.named_parameters():
        torch.testing.assert_close(param, dict(recompute.role("actor").model.named_parameters())[name])


def test_sft_and_metrics_from_a_full_rl_loss(core):
    batch = make_batch(core.role("actor").spec.vocab_size)
    metrics = run_steps(core, batch, steps=1)[0]
    for key in ("loss", "grad_norm", "lr", "clip_fraction", "kl", "entropy", "pg_loss"):
        assert np.isfinite(metrics[key]), key
    nll = [core.train_step("actor", batch, LossConfig(policy_loss="sft")).metrics["loss"] for _ in range(3)]
    assert nll[2] < nll[0]


def test_bad_inputs_are_refused(core):
    batch = make_batch(core.role("actor").spec.vocab_size)
    without = {k: v for k, v in batch.items() if k != "advantages"}
    with pytest.raises(InvalidArgument, match="no column 'advantages'"):
        core.train_step("actor", without)
    short = dict(batch, advantages=Ragged.from_rows([[1.0]] * 8, np.float32))
    with pytest.raises(InvalidArgument, match="'advantages' is not aligned"):
        core.train_step("actor", short)
    bad_ids = dict(batch, response_ids=Ragged(batch["response_ids"].values + 10_000, batch["response_ids"].offsets))
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        core.compute_logprobs("actor", bad_ids)
    nan = batch["advantages"].values.copy()
    nan[3] = np.nan
    with pytest.raises(InvalidArgument, match="'advantages' row .* non-finite"):
        core.train_step("actor", dict(batch, advantages=Ragged(nan, batch["advantages"].offsets)))
    with pytest.raises(FailedPrecondition, match="no model loaded for role 'critic'"):
        core.compute_values(batch)
    with pytest.raises(InvalidArgument, match="mini_batches"):
        core.train_step("actor", batch, mini_batches=100)


def test_step_lrs_make_one_step_per_rate_as_separate_calls_would(core, qwen2_dir):
    """A supervised warm-up's several steps in one call: step k trains on the k-th row chunk at rate k; the
    weights, step count and each step's loss are those of one call per chunk with that rate as lr_override."""
    batch = make_batch(core.role("actor").spec.vocab_size, rows=8)
    sft, lrs = LossConfig(policy_loss="sft"), [3e-3, 2e-3, 1e-3, 5e-4]
    separate = TrainerCore(micro_batch_tokens=4096)
    separate.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2))
    want = []
    for k, lr in enumerate(lrs):
        rows = {name: col.take([2 * k, 2 * k + 1]) for name, col in batch.items()}
        want.append(separate.train_step("actor", rows, sft, lr_override=lr).metrics["loss"])
    got = core.train_step("actor", batch, sft, step_lrs=lrs)
    assert got.optimizer_steps == 4 and core.role("actor").train_steps == 4
    assert got.step_losses == pytest.approx(want, rel=1e-6) and got.metrics["lr"] == pytest.approx(np.mean(lrs))
    for name, param in core.role("actor").model.named_parameters():
        torch.testing.assert_close(param, dict(separate.role("actor").model.named_parameters())[name])
    huge = batch["advantages"].values.copy()
    huge[-5:] = 3e38  # the last row's loss overflows: steps 1-3 apply, step 4 is undone alone (no snapshot)
    with pytest.raises(NonFiniteLoss, match="step 4 of 4 .* the 3 steps before it stay applied"):
        core.train_step("actor", dict(batch, advantages=Ragged(huge, batch["advantages"].offsets)), step_lrs=lrs)
    assert core.role("actor").train_steps == 7
    with pytest.raises(InvalidArgument, match="one rate per optimizer step"):
        core.train_step("actor", batch, sft, mini_batches=2, step_lrs=lrs)
    with pytest.raises(InvalidArgument, match="finite and > 0"):
        core.train_step("actor", batch, sft, step_lrs=[1e-3, 0.0])
    assert core.role("actor").train_steps == 7  # refused calls trained nothing


def test_non_finite_loss_leaves_model_and_optimizer_untouched(core):
    batch = make_batch(core.role("actor").spec.vocab_size)
    core.train_step("actor", batch)  # the optimizer has state now
    before = _params(core)
    opt_before = {k: v.clone() for k, v in core.role("actor").optimizer.state_dict()["state"][0].items()}
    huge = batch["advantages"].values.copy()
    huge[-5:] = 3e38  # finite inputs; the summed loss overflows to inf in the second mini-batch
    with pytest.raises(NonFiniteLoss, match="non-finite loss"):
        core.train_step("actor", dict(batch, advantages=Ragged(huge, batch["advantages"].offsets)), mini_batches=2)
    for name, param in core.role("actor").model.named_parameters():
        assert torch.equal(param, before[name]), name
    for k, v in core.role("actor").optimizer.state_dict()["state"][0].items():
        assert torch.equal(v, opt_before[k])
    assert core.role("actor").train_steps == 1


def test_reference_is_frozen_and_critic_learns_values(core, qwen2_dir):
    batch = make_batch(core.role("actor").spec.vocab_size)
    core.load_model("reference", str(qwen2_dir))
    ref = core.compute_logprobs("reference", batch)
    np.testing.assert_allclose(ref.values.values, core.compute_logprobs("actor", batch).values.values, atol=1e-6)
    with pytest.raises(FailedPrecondition, match="frozen"):
        core.train_step("reference", batch)
    core.load_model("critic", str(qwen2_dir), optimizer=OptimizerConfig(lr=3e-3))
    values = core.compute_values(batch)
    assert np.array_equal(values.values.offsets, batch["response_ids"].offsets)
    returns = Ragged(np.ones_like(values.values.values), values.values.offsets)
    critic_batch = dict(batch, returns=returns, values=values.values)
    losses = [core.train_step("critic", critic_batch, LossConfig(policy_loss="value")).metrics for _ in range(4)]
    assert losses[-1]["vf_loss"] < losses[0]["vf_loss"]
    with pytest.raises(InvalidArgument, match="does not fit role"):
        core.train_step("critic", critic_batch, LossConfig(policy_loss="ppo"))
    assert "score.weight" in core.checksums("critic")


def test_checkpoint_resume_is_bit_identical_in_a_new_process(core, qwen2_dir, tmp_path):
    batch = make_batch(core.role("actor").spec.vocab_size)
    run_steps(core, batch, steps=2)
    path = tmp_path / "ckpt"
    size = core.save_checkpoint("actor", str(path), step=7, data_state=b'{"epoch": 1}')
    assert size > 0 and (path / "COMPLETE").exists()
    expected = run_steps(core, make_batch(core.role("actor").spec.vocab_size, seed=1), steps=1)
    out = tmp_path / "resume.json"
    # the same number of intra-op threads on both sides, or float reductions differ in the last bits
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    proc = subprocess.run(
        [sys.executable, WORKER, "resume", str(qwen2_dir), str(path), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["step"] == 7 and got["data_state"] == '{"epoch": 1}'
    assert got["metrics"] == expected  # bit-identical floats
    assert got["checksums"] == core.checksums("actor")


def test_incomplete_or_corrupt_checkpoints_are_refused(core, tmp_path):
    path = tmp_path / "ckpt"
    core.save_checkpoint("actor", str(path), step=1)
    core.save_checkpoint("actor", str(path), step=2)  # replacing an existing checkpoint works
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp or old directories left behind
    before = _params(core)
    (path / "COMPLETE").rename(path / "COMPLETE.bak")
    with pytest.raises(FailedPrecondition, match="no COMPLETE marker"):
        core.load_checkpoint("actor", str(path))
    (path / "COMPLETE.bak").rename(path / "COMPLETE")
    data = bytearray((path / "model-tp0-pp0.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (path / "model-tp0-pp0.safetensors").write_bytes(bytes(data))
    with pytest.raises(DataLoss, match="model-tp0-pp0.safetensors is missing or corrupt"):
        core.load_checkpoint("actor", str(path))
    for name, param in core.role("actor").model.named_parameters():
        assert torch.equal(param, before[name])


def test_two_data_parallel_ranks_equal_one(qwen2_dir, tmp_path):
    """Two ranks with Megatron's distributed optimizer train like one process with the plain one."""
    out = tmp_path / "dp.json"
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, "dp", str(qwen2_dir), str(out), str(rank), "2", str(tmp_path / "init")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    two = json.loads(out.read_text())
    single = TrainerCore()
    single.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2))
    batch = make_batch(single.role("actor").spec.vocab_size)
    one = run_steps(single, batch)
    for m1, m2 in zip(one, two["metrics"], strict=True):
        for key in ("loss", "grad_norm", "kl", "entropy", "clip_fraction", "lr"):
            assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
    logprobs = single.compute_logprobs("actor", batch, micro_batch_tokens=24).values.values
    np.testing.assert_allclose(np.array(two["logprobs"]), logprobs, atol=1e-4)
    assert LOSS["kl_coef"] > 0  # the DP run exercised the KL and entropy terms too


def test_distributed_optimizer_checkpoints_resume_at_another_layout(qwen2_dir, tmp_path):
    """Plain Adam (1 process) -> a checkpoint -> 2 ranks with Megatron's distributed optimizer resume it, step,
    and save their shards of the Adam state -> 1 process with plain Adam resumes that: each resumed step equals
    the step of a process that never stopped."""
    single = TrainerCore()
    single.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2))
    vocab = single.role("actor").spec.vocab_size
    run_steps(single, make_batch(vocab))
    single.save_checkpoint("actor", str(tmp_path / "plain"), step=3)
    out, init = tmp_path / "dp.json", tmp_path / "init"
    args = [str(qwen2_dir), str(out), "RANK", "2", str(init), str(tmp_path / "plain"), str(tmp_path / "sharded")]
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, "dp_ckpt", *[str(r) if a == "RANK" else a for a in args]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    two = json.loads(out.read_text())
    files = sorted(f.name for f in (tmp_path / "sharded").iterdir() if f.name.startswith("optim-"))
    assert files == ["optim-tp0-pp0-dp0.safetensors", "optim-tp0-pp0-dp1.safetensors"]  # each rank its share
    expected = run_steps(single, make_batch(vocab, seed=1), steps=1)
    assert two["step"] == 3
    for key in ("loss", "grad_norm", "kl", "entropy", "lr"):
        assert two["metrics"][0][key] == pytest.approx(expected[0][key], rel=1e-4, abs=1e-6), key
    resumed = TrainerCore()
    resumed.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2))
    assert resumed.load_checkpoint("actor", str(tmp_path / "sharded"))[0] == 4
    batch = make_batch(vocab, seed=2)
    got, want = run_steps(resumed, batch, steps=1)[0], run_steps(single, batch, steps=1)[0]
    for key in ("loss", "grad_norm", "kl", "entropy", "lr"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    np.testing.assert_allclose(
        resumed.compute_logprobs("actor", batch).values.values,
        single.compute_logprobs("actor", batch).values.values,
        atol=1e-5,
    )
