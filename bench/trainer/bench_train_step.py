"""Train-step time through the trainer service vs. the same megatron-core model trained in-process.

Side by side in one run, on the same batch: (a) `TrainStep` over gRPC against `python -m meshrl.trainer`
(one rank), which reads the batch from a real data buffer (`python -m meshrl.databuffer` on Redis) each
step; (b) `TrainerCore.train_step` in this process on the same columns. Steps alternate service /
in-process (order flipped every pair) and the medians are compared; also prints tokens/s. The issue's
target is a ratio <= 1.10. Run: .venv/bin/python bench/trainer/bench_train_step.py [--rows 32 ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import numpy as np
import torch

from meshrl.api.trainer.v1 import trainer_pb2 as pb
from meshrl.api.trainer.v1 import trainer_pb2_grpc
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.losses import LossConfig
from meshrl.trainer.model_builder import build_small_model
from meshrl.trainer.optim import OptimizerConfig


def start(service: str, args: list[str], workdir: Path) -> tuple[subprocess.Popen, str]:
    port_file = workdir / f"{service}.port"
    log = (workdir / f"{service}.log").open("wb")
    cmd = [sys.executable, "-m", f"meshrl.{service}", *args, "--set", f"server.port_file={port_file}"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{service} did not start; see {workdir / (service + '.log')}")
        time.sleep(0.2)
    return proc, f"127.0.0.1:{port_file.read_text().strip()}"


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def make_batch(vocab: int, rows: int, prompt: int, response: int, seed: int = 0) -> dict[str, Ragged]:
    rng = np.random.default_rng(seed)
    p_len = rng.integers(prompt // 2, prompt + 1, rows)
    r_len = rng.integers(response // 2, response + 1, rows)
    prompts = Ragged.from_rows([rng.integers(0, vocab, n) for n in p_len], np.int32)
    responses = Ragged.from_rows([rng.integers(0, vocab, n) for n in r_len], np.int32)
    n = int(responses.offsets[-1])
    return {
        "prompt_ids": prompts,
        "response_ids": responses,
        "advantages": Ragged(np.repeat(rng.normal(size=rows), r_len).astype(np.float32), responses.offsets),
        "old_logprobs": Ragged((-5.0 + 0.1 * rng.normal(size=n)).astype(np.float32), responses.offsets),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--redis-url", default=os.environ.get("MESHRL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="meshrl-bench-trainer-"))
    model_dir = build_small_model(
        work / "model", hidden_size=args.hidden, num_layers=args.layers, num_heads=4, num_kv_heads=2
    )
    prefix = f"mbench{uuid.uuid4().hex[:8]}"
    buffer_proc, buffer_addr = start(
        "databuffer", ["--set", f"redis.url={args.redis_url}", "--set", f"redis.key_prefix={prefix}"], work
    )
    trainer_proc, trainer_addr = start(
        "trainer", ["--set", f"databuffer_address={buffer_addr}", "--set", f"torch_threads={args.threads}"], work
    )
    try:
        opt = OptimizerConfig(lr=1e-5)
        core = TrainerCore()
        core.load_model("actor", str(model_dir), optimizer=opt)
        batch = make_batch(core.role("actor").spec.vocab_size, args.rows, args.prompt, args.response)
        tokens = int(batch["response_ids"].offsets[-1])
        seq_tokens = tokens + int(batch["prompt_ids"].offsets[-1])
        buffer = DataBufferClient(buffer_addr)
        key = batch_key("bench", 0, "batch")
        buffer.put(key, batch)
        channel = grpc.insecure_channel(trainer_addr)
        stub = trainer_pb2_grpc.TrainerStub(channel)
        stub.LoadModel(
            pb.LoadModelRequest(role=pb.ROLE_ACTOR, model_path=str(model_dir), optimizer=pb.OptimizerConfig(lr=1e-5)),
            timeout=300,
        )
        request = pb.TrainStepRequest(role=pb.ROLE_ACTOR, inputs=[key], micro_batch_tokens=args.micro_batch_tokens)
        cfg = LossConfig()

        inside: list[tuple[float, float]] = []

        def via_service() -> float:
            t = time.perf_counter()
            reply = stub.TrainStep(request, timeout=600)
            inside.append((reply.metrics["perf/read_seconds"], reply.metrics["perf/step_seconds"]))
            return time.perf_counter() - t

        def in_process() -> float:
            t = time.perf_counter()
            core.train_step("actor", batch, cfg, micro_batch_tokens=args.micro_batch_tokens)
            return time.perf_counter() - t

        via_service(), in_process()  # warm-up
        svc, local = [], []
        for i in range(args.pairs):
            order = (via_service, in_process) if i % 2 == 0 else (in_process, via_service)
            for fn in order:
                (svc if fn is via_service else local).append(fn())
        s, lo = statistics.median(svc), statistics.median(local)
        print(
            f"model: hidden {args.hidden}, {args.layers} layers, {core.role('actor').num_parameters:,} parameters; "
            f"batch: {args.rows} rows, {tokens} response tokens ({seq_tokens} with prompts); "
            f"{args.threads} torch thread(s)"
        )
        print(f"{'':24}{'median s':>10}{'min s':>10}{'resp tok/s':>12}{'seq tok/s':>12}")
        for name, times in (("service (gRPC+buffer)", svc), ("in-process core", local)):
            m = statistics.median(times)
            print(f"{name:24}{m:10.3f}{min(times):10.3f}{tokens / m:12.0f}{seq_tokens / m:12.0f}")
        read = statistics.median(r for r, _ in inside[1:])
        step = statistics.median(st for _, st in inside[1:])
        print(
            f"inside the service (median): batch read {read * 1e3:.1f} ms, train step {step:.3f} s; "
            f"gRPC + rest {max(0.0, s - read - step) * 1e3:.1f} ms"
        )
        print(f"ratio service / in-process: median {s / lo:.3f}, best {min(svc) / min(local):.3f}   (target <= 1.10)")
        buffer.delete_job("bench")
        buffer.close()
        channel.close()
    finally:
        stop(trainer_proc)
        stop(buffer_proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
