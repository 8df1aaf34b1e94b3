"""Subprocess helper of the trainer tests: data-parallel ranks and resume-from-checkpoint runs.

Usage: python _worker.py dp MODEL_DIR OUT_JSON RANK WORLD INIT_FILE
       python _worker.py dp_ckpt MODEL_DIR OUT_JSON RANK WORLD INIT_FILE LOAD_DIR SAVE_DIR
       python _worker.py resume MODEL_DIR CKPT_DIR OUT_JSON
Each writes a JSON result (metrics, log-probs, weight checksums) for the test to compare.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from meshrl.common.codec import Ragged


def make_batch(vocab: int, seed: int = 0, rows: int = 8) -> dict[str, Ragged]:
    """A fixed RL batch: prompts, responses, advantages (grouped), old and reference log-probs."""
    rng = np.random.default_rng(seed)
    prompts = Ragged.from_rows([rng.integers(0, vocab, rng.integers(2, 9)) for _ in range(rows)], np.int32)
    responses = Ragged.from_rows([rng.integers(0, vocab, rng.integers(1, 11)) for _ in range(rows)], np.int32)
    n = int(responses.offsets[-1])
    adv = np.repeat(rng.normal(size=rows), responses.lengths()).astype(np.float32)
    return {
        "prompt_ids": prompts,
        "response_ids": responses,
        "advantages": Ragged(adv, responses.offsets),
        "old_logprobs": Ragged((-5.6 + 0.1 * rng.normal(size=n)).astype(np.float32), responses.offsets),
        "ref_logprobs": Ragged((-5.6 + 0.1 * rng.normal(size=n)).astype(np.float32), responses.offsets),
    }


LOSS = dict(kl_coef=0.05, entropy_coef=0.01, clip_high=0.28)


def run_steps(core, batch, steps: int = 2) -> list[dict]:
    from meshrl.trainer.losses import LossConfig

    return [
        core.train_step("actor", batch, LossConfig(**LOSS), micro_batch_tokens=24, mini_batches=2).metrics
        for _ in range(steps)
    ]


def _dp(model_dir: str, out: str, rank: int, world: int, init_file: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from meshrl.trainer.core import TrainerCore
    from meshrl.trainer.optim import OptimizerConfig

    core = TrainerCore()  # Megatron's distributed optimizer: Adam state sharded over the two ranks
    core.load_model("actor", model_dir, optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2, distributed=True))
    batch = make_batch(core.role("actor").spec.vocab_size)
    metrics = run_steps(core, batch)
    logprobs = core.compute_logprobs("actor", batch, micro_batch_tokens=24).values.values.tolist()
    result = {"metrics": metrics, "logprobs": logprobs, "checksums": core.checksums("actor")}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def _dp_ckpt(model_dir: str, out: str, rank: int, world: int, init_file: str, load_dir: str, save_dir: str) -> None:
    """Two ranks with the distributed optimizer resume a single process's checkpoint, take a step, and save
    their own (every rank its share of the Adam state)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from meshrl.trainer.core import TrainerCore
    from meshrl.trainer.optim import OptimizerConfig

    core = TrainerCore()
    core.load_model("actor", model_dir, optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2, distributed=True))
    step, _ = core.load_checkpoint("actor", load_dir)
    metrics = run_steps(core, make_batch(core.role("actor").spec.vocab_size, seed=1), steps=1)
    core.save_checkpoint("actor", save_dir, step=step + 1)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"metrics": metrics, "step": step}, f)
    dist.barrier()
    dist.destroy_process_group()


def _resume(model_dir: str, ckpt_dir: str, out: str) -> None:
    from meshrl.trainer.core import TrainerCore
    from meshrl.trainer.optim import OptimizerConfig

    core = TrainerCore()
    core.load_model("actor", model_dir, optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2))
    step, data_state = core.load_checkpoint("actor", ckpt_dir)
    batch = make_batch(core.role("actor").spec.vocab_size, seed=1)
    metrics = run_steps(core, batch, steps=1)
    with open(out, "w") as f:
        json.dump(
            {"step": step, "data_state": data_state.decode(), "metrics": metrics, "checksums": core.checksums("actor")},
            f,
        )


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "dp":
        _dp(args[0], args[1], int(args[2]), int(args[3]), args[4])
    elif mode == "dp_ckpt":
        _dp_ckpt(args[0], args[1], int(args[2]), int(args[3]), args[4], args[5], args[6])
    else:
        _resume(*args)
