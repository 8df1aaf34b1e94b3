"""Rollout throughput, measured side by side in one run (issue 5's figures).

1. Batched decoding: 64 requests submitted at once vs the same 64 one after another (same engine).
2. Generated tokens/s through the service (a replica process, GenerateBatch over the data buffer,
   through the router) vs the same engine called in-process. Target: service / in-process >= 0.9.
3. Throughput of 1 vs 2 replica processes on the same batch (every engine uses --threads torch threads).
Every request generates exactly --max-tokens tokens (ignore_eos), so token counts are equal.

Run: .venv/bin/python bench/rollout/run.py [--prompts 64] [--max-tokens 64] [--repeats 3]
Needs the machine's Redis at 127.0.0.1:6379 (the data buffer and the replica registry use it).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import redis

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.common.registry import SERVING, ReplicaRegistry
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.transformers_engine import TransformersEngine
from meshrl.rollout.types import GenerationRequest, SamplingParams
from meshrl.scheduler.fleet.router import RolloutRouter
from meshrl.trainer.model_builder import build_small_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests._databuffer
from tests._databuffer import SYSTEM_REDIS, config, delete_prefix, serving, unique_prefix  # noqa: E402


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 250, size=int(rng.integers(8, 24))).tolist() for _ in range(count)]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def start_replica(rid: str, model: Path, buffer: str, namespace: str, threads: int | None, logs: Path, batch: int):
    args = {
        "engine.model_path": model,
        "engine.max_batch_size": batch,
        "registry.redis_url": SYSTEM_REDIS,
        "registry.namespace": namespace,
        "registry.heartbeat_seconds": 0.5,
        "databuffer_address": buffer,
        "replica_id": rid,
    }
    if threads:
        args["engine.transformers.num_threads"] = threads
    cmd = [sys.executable, "-m", "meshrl.rollout", "--port", "0"]
    for k, v in args.items():
        cmd += ["--set", f"{k}={v}"]
    log = open(logs / f"{rid}.log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return proc


def stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of every engine (in-process and replicas)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    model = build_small_model(work / "model", hidden_size=args.hidden_size, num_layers=2, max_position_embeddings=512)
    sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True)
    batch = prompts(args.prompts)
    tokens = args.prompts * args.max_tokens
    print(
        f"model: hidden {args.hidden_size}, 2 layers; {args.prompts} prompts x {args.max_tokens} tokens; "
        f"{args.threads} torch thread(s) per engine; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )

    # 1. batched vs sequential, in-process
    engine = TransformersEngine(
        EngineConfig(model_path=str(model), max_batch_size=args.prompts, transformers={"num_threads": args.threads})
    )
    engine.generate([GenerationRequest(p, sampling) for p in batch[:4]])  # warm-up
    concurrent, sequential, inproc = [], [], []
    for _ in range(args.repeats):
        concurrent.append(timed(lambda: engine.generate([GenerationRequest(p, sampling) for p in batch])))
        sequential.append(timed(lambda: [engine.generate([GenerationRequest(p, sampling)]) for p in batch]))
    c, s = statistics.median(concurrent), statistics.median(sequential)
    print(
        f"[1] {args.prompts} concurrent: {c:.2f}s   {args.prompts} sequential: {s:.2f}s   "
        f"speed-up {s / c:.1f}x   ({tokens / c:.0f} vs {tokens / s:.0f} tokens/s)"
    )

    prefix = unique_prefix("bench-rollout")
    namespace = f"bench-rollout-{uuid.uuid4().hex[:8]}"
    procs = []
    with serving(config(SYSTEM_REDIS, prefix)) as (_, running):
        client = DataBufferClient(running.address)
        registry = ReplicaRegistry(SYSTEM_REDIS, namespace=namespace)
        source = batch_key("bench", 0, "data")
        client.put(source, {S.PROMPT_IDS: Ragged.from_rows(batch, dtype=np.int32)})
        proto = {"temperature": 1.0, "max_tokens": args.max_tokens, "ignore_eos": True}
        try:
            # 2. through the service vs in-process (alternating, the in-process engine idle meanwhile)
            procs.append(start_replica("r0", model, running.address, namespace, args.threads, work, args.prompts))
            registry.wait_for(lambda rs: any(r.replica_id == "r0" and r.state == SERVING for r in rs), timeout=300)
            router = RolloutRouter(registry=registry, databuffer=client)
            router.generate_batch(source, batch_key("bench", 0, "warm"), {**proto, "max_tokens": 4})
            service = []
            for i in range(args.repeats):
                inproc.append(timed(lambda: engine.generate([GenerationRequest(p, sampling) for p in batch])))
                service.append(
                    timed(lambda i=i: router.generate_batch(source, batch_key("bench", 1, f"svc{i}"), proto))
                )
            engine.shutdown()
            t_in, t_svc = statistics.median(inproc), statistics.median(service)
            print(
                f"[2] in-process: {tokens / t_in:.0f} tokens/s   through the service: {tokens / t_svc:.0f} tokens/s   "
                f"ratio {t_in / t_svc:.2f} (target >= 0.9)"
            )
            router.close()
            stop(procs)
            procs.clear()

            # 3. one vs two replica processes: both run; runs alternate between a router over one and over both
            for rid in ("a0", "a1"):
                procs.append(start_replica(rid, model, running.address, namespace, args.threads, work, args.prompts))
            ready = registry.wait_for(
                lambda rs: {r.replica_id for r in rs if r.state == SERVING} >= {"a0", "a1"}, timeout=300
            )
            address = {r.replica_id: r.address for r in ready}
            routers = {
                1: RolloutRouter(addresses=[address["a0"]], databuffer=client, default_capacity=args.prompts),
                2: RolloutRouter(
                    addresses=[address["a0"], address["a1"]], databuffer=client, default_capacity=args.prompts
                ),
            }
            for n, r in routers.items():
                r.generate_batch(source, batch_key("bench", 2, f"warm{n}"), {**proto, "max_tokens": 4})
            times: dict[int, list[float]] = {1: [], 2: []}
            for i in range(2 * args.repeats):
                for n in (1, 2) if i % 2 == 0 else (2, 1):
                    key = batch_key("bench", 3, f"r{n}-{i}")
                    times[n].append(timed(lambda n=n, key=key: routers[n].generate_batch(source, key, proto)))
            t1, t2 = statistics.median(times[1]), statistics.median(times[2])
            print(
                f"[3] 1 replica: {tokens / t1:.0f} tokens/s   2 replicas: {tokens / t2:.0f} tokens/s   "
                f"ratio {t1 / t2:.2f}x"
            )
            for r in routers.values():
                r.close()
        finally:
            stop(procs)
            client.close()
            for key in redis.Redis.from_url(SYSTEM_REDIS).scan_iter(match=f"{namespace}:*"):
                redis.Redis.from_url(SYSTEM_REDIS).delete(key)
    delete_prefix(redis.Redis.from_url(SYSTEM_REDIS), prefix)


if __name__ == "__main__":
    main()
