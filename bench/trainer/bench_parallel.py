"""Train-step time of one megatron-core model at several parallel layouts, side by side in one run.

Layouts (gloo, one torch thread per rank unless said): TP=1 (1 rank), TP=1 with 2 threads (the same cores as
two ranks), TP=2 (2 ranks), PP=2 (2 ranks, 1F1B over the micro-batches). Each layout runs `TrainerCore.train_step`
(Megatron schedules, DDP, optimizer) on the same batch in its own processes: warm-up steps, then the median
of timed steps (a barrier before each). Prints medians and the ratios TP=2 / TP=1 and PP=2 / TP=1.
Run: .venv/bin/python bench/trainer/bench_parallel.py [--hidden 512 --layers 6 --rows 8 --steps 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LAYOUTS = [("TP=1", 1, 1, 1), ("TP=1 x2 threads", 1, 1, 2), ("TP=2", 2, 1, 1), ("PP=2", 1, 2, 1)]


def make_batch(vocab: int, rows: int, length: int, seed: int = 0) -> dict:
    from meshrl.common.codec import Ragged

    rng = np.random.default_rng(seed)
    prompts = Ragged.from_rows([rng.integers(0, vocab, length // 4) for _ in range(rows)], np.int32)
    responses = Ragged.from_rows([rng.integers(0, vocab, length - length // 4) for _ in range(rows)], np.int32)
    adv = np.repeat(rng.normal(size=rows), responses.lengths()).astype(np.float32)
    return {
        "prompt_ids": prompts,
        "response_ids": responses,
        "advantages": Ragged(adv, responses.offsets),
        "old_logprobs": Ragged(np.full(int(responses.offsets[-1]), -5.6, np.float32), responses.offsets),
    }


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{args.init}", rank=args.rank, world_size=args.world)
    from meshrl.trainer.core import TrainerCore
    from meshrl.trainer.losses import LossConfig
    from meshrl.trainer.optim import OptimizerConfig

    core = TrainerCore(tensor_parallel=args.tp, pipeline_parallel=args.pp)
    state = core.load_model("actor", args.model, optimizer=OptimizerConfig(lr=1e-5))
    batch = make_batch(state.spec.vocab_size, args.rows, args.length)
    budget = args.rows * args.length // 4  # four micro-batches
    times = []
    for step in range(args.warmup + args.steps):
        dist.barrier()
        start = time.perf_counter()
        core.train_step("actor", batch, LossConfig(), micro_batch_tokens=budget)
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    if args.rank == 0:
        Path(args.out).write_text(json.dumps({"times": times, "params": state.num_parameters}))
    dist.destroy_process_group()


def run_layout(script: Path, model: str, tmp: Path, tp: int, pp: int, threads: int, opts) -> dict:
    world = tp * pp
    init, out = tmp / f"init-{tp}-{pp}-{threads}", tmp / f"out-{tp}-{pp}-{threads}.json"
    common = [
        "--model",
        model,
        "--init",
        str(init),
        "--out",
        str(out),
        "--tp",
        str(tp),
        "--pp",
        str(pp),
        "--world",
        str(world),
        "--threads",
        str(threads),
        "--rows",
        str(opts.rows),
        "--length",
        str(opts.length),
        "--steps",
        str(opts.steps),
        "--warmup",
        str(opts.warmup),
    ]
    procs = [
        subprocess.Popen([sys.executable, "-W", "ignore", str(script), "--worker", "--rank", str(r), *common])
        for r in range(world)
    ]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise RuntimeError(f"layout TP={tp} PP={pp}: a rank exited with {p.returncode}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name, default in (("rank", 0), ("world", 1), ("tp", 1), ("pp", 1), ("threads", 1)):
        parser.add_argument(f"--{name}", type=int, default=default, help=argparse.SUPPRESS)
    for name in ("model", "init", "out"):
        parser.add_argument(f"--{name}", default="", help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=128, help="tokens per row (prompt + response)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from meshrl.trainer.model_builder import build_small_model

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = str(
            build_small_model(
                tmp / "model",
                hidden_size=args.hidden,
                num_layers=args.layers,
                num_heads=8,
                num_kv_heads=4,
                intermediate_size=args.hidden * 11 // 4,
            )
        )
        results = {name: run_layout(Path(__file__), model, tmp, tp, pp, th, args) for name, tp, pp, th in LAYOUTS}
    params = next(iter(results.values()))["params"]
    print(
        f"model: {params / 1e6:.1f}M parameters, batch {args.rows} x {args.length} tokens, 4 micro-batches, "
        f"median of {args.steps} steps"
    )
    base = statistics.median(results["TP=1"]["times"])
    print(f"{'layout':<18}{'step s':>9}{'÷ TP=1':>9}")
    for name, result in results.items():
        median = statistics.median(result["times"])
        print(f"{name:<18}{median:>9.3f}{median / base:>9.2f}")


if __name__ == "__main__":
    main()
