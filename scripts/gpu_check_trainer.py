"""Device check of the trainer's GPU path: CUDA RNG seeding, NCCL, bf16 with fp32 master weights.

Runs on one CUDA device without Ray, Redis or a network (needs torch with CUDA, megatron-core, transformers,
safetensors and the meshrl distributions): a one-rank NCCL world, Megatron's model-parallel RNG tracker seeded
(its attention fails on the first forward otherwise), a small Qwen2-style model loaded in fp32 and in bf16,
log-probs of both against transformers, and one bf16 train step whose optimizer keeps fp32 master weights.
Prints one line per check and exits 1 on the first failure. Run: python scripts/gpu_check_trainer.py
"""

from __future__ import annotations

import datetime
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        sys.exit(1)


def batch(vocab: int) -> dict:
    from meshrl.common.codec import Ragged

    rng = np.random.default_rng(0)
    prompts = Ragged.from_rows([rng.integers(0, vocab, 6) for _ in range(4)], np.int32)
    responses = Ragged.from_rows([rng.integers(0, vocab, 9) for _ in range(4)], np.int32)
    adv = np.repeat(rng.normal(size=4), responses.lengths()).astype(np.float32)
    old = Ragged(np.full(int(responses.offsets[-1]), -5.6, np.float32), responses.offsets)
    return {
        "prompt_ids": prompts,
        "response_ids": responses,
        "advantages": Ragged(adv, responses.offsets),
        "old_logprobs": old,
    }


def hf_logprobs(model_dir: str, columns: dict) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    out = []
    for p, r in zip(columns["prompt_ids"].rows(), columns["response_ids"].rows(), strict=True):
        ids = torch.tensor(np.concatenate([p, r]), device="cuda")[None].long()
        with torch.no_grad():
            logp = hf(ids).logits.float().log_softmax(-1)[0, len(p) - 1 : -1]
        out.append(logp.gather(-1, ids[0, len(p) :, None]).squeeze(-1).cpu().numpy())
    return np.concatenate(out)


def main() -> None:
    check(
        "cuda available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    )
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=60))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    probe = torch.ones(4, device="cuda")
    dist.all_reduce(probe)
    check("nccl all_reduce", bool(probe.eq(1).all()), dist.get_backend())

    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    from meshrl.trainer.core import TrainerCore
    from meshrl.trainer.losses import LossConfig
    from meshrl.trainer.model_builder import build_small_model
    from meshrl.trainer.optim import OptimizerConfig

    model_dir = str(build_small_model(tempfile.mkdtemp(), hidden_size=64, num_layers=2, seed=1))
    core = TrainerCore()
    core.load_model("reference", model_dir)
    states = get_cuda_rng_tracker().get_states()
    check("cuda rng tracker seeded", "model-parallel-rng" in states, str(sorted(states)))
    columns = batch(core.role("reference").spec.vocab_size)
    want = hf_logprobs(model_dir, columns)
    fp32 = core.compute_logprobs("reference", columns).values.values
    check("fp32 log-probs = transformers", float(np.abs(fp32 - want).max()) < 1e-3, f"{np.abs(fp32 - want).max():.2e}")

    state = core.load_model("actor", model_dir, dtype="bfloat16", optimizer=OptimizerConfig(lr=1e-4))
    bf16 = core.compute_logprobs("actor", columns).values.values
    check("bf16 log-probs near fp32", float(np.abs(bf16 - fp32).max()) < 0.2, f"{np.abs(bf16 - fp32).max():.2e}")
    param = next(p for p in state.model.parameters() if p.ndim == 2)
    master = getattr(param, "main_param", None)
    check(
        "bf16 params, fp32 master weights",
        param.dtype == torch.bfloat16 and master is not None and master.dtype == torch.float32,
    )
    before = master.detach().clone()
    metrics = core.train_step("actor", columns, LossConfig()).metrics
    moved = float((master - before).abs().max())
    check(
        "bf16 train step updates the fp32 master", np.isfinite(metrics["loss"]) and moved > 0, f"max |dw| {moved:.2e}"
    )
    check("bf16 weights follow the master", float((param.float() - master).abs().max()) < 1e-2)
    dist.destroy_process_group()
    print("all trainer GPU checks passed")


if __name__ == "__main__":
    main()
