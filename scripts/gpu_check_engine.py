"""Device check of the rollout side: the transformers engine generating on a device, colocated publication
trainer -> replica in place (CUDA IPC handles on a GPU, shared memory on the CPU) verified by checksums with
its GB/s, and the engines' weight-group wire between two processes (NCCL with two GPUs, gloo on the CPU).

Called by scripts/gpu_check.sh (`--device cpu` is the CI twin). Prints one line per figure and exits 1 on the
first wrong one. Needs torch, transformers, safetensors and the meshrl distributions; no Ray, Redis or network.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        sys.exit(1)


def generation(model_dir: Path, device: str) -> None:
    from transformers import AutoModelForCausalLM

    from meshrl.rollout.config import EngineConfig
    from meshrl.rollout.transformers_engine import TransformersEngine
    from meshrl.rollout.types import GenerationRequest, SamplingParams

    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    engine = TransformersEngine(
        EngineConfig(model_path=str(model_dir), transformers={"device": device, "dtype": dtype})
    )
    try:
        prompt, n = [3, 1, 4, 1, 5, 9], 24
        start = time.perf_counter()
        out = engine.generate(
            [GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))]
        )
        seconds = time.perf_counter() - start
        tokens = out[0].token_ids
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
        ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            want = hf.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n)[0, len(prompt) :].tolist()
        same = sum(a == b for a, b in zip(tokens, want))
        check(
            f"transformers engine generates on {device}",
            len(tokens) == n and same >= n // 2,
            f"{n} tokens in {seconds:.2f}s, {same}/{n} equal to transformers' greedy ({dtype})",
        )
    finally:
        engine.shutdown()


def _start_method(device: str) -> str:
    """CUDA needs fresh processes; on the CPU a fork starts in milliseconds."""
    return "spawn" if device.startswith("cuda") else "fork"


def _replica(queue, done) -> None:
    """The colocated replica: maps the trainer's tensors (IPC handles / shared memory), copies them into
    its own weights, hashes them and hands the checksums back."""
    from meshrl.common.weights import tensor_checksums

    done.put("ready")
    named = queue.get()
    start = time.perf_counter()
    own = {n: torch.empty_like(t) for n, t in named.items()}
    for n, t in named.items():
        own[n].copy_(t)
    if any(t.is_cuda for t in own.values()):
        torch.cuda.synchronize()
    done.put((time.perf_counter() - start, tensor_checksums(own, sorted(own))))
    del named


def colocated_publication(device: str, mib: int) -> None:
    from meshrl.common.weights import tensor_checksums

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    per = (mib << 20) // 8 // torch.tensor([], dtype=dtype).element_size()
    g = torch.Generator(device=device).manual_seed(0)
    named = {f"layer{i}.weight": torch.randn(per, generator=g, device=device).to(dtype) for i in range(8)}
    ctx = mp.get_context(_start_method(device))
    queue, done = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_replica, args=(queue, done))
    proc.start()
    check("replica process started", done.get(timeout=300) == "ready")
    start = time.perf_counter()
    queue.put(named)  # CUDA tensors travel as IPC handles, CPU tensors through shared memory: no copy here
    seconds_copy, sums = done.get(timeout=300)
    total = time.perf_counter() - start
    proc.join(60)
    nbytes = sum(t.numel() * t.element_size() for t in named.values())
    how = "CUDA IPC" if device.startswith("cuda") else "shared memory"
    check(
        f"colocated publication via {how}",
        sums == tensor_checksums(named, sorted(named)),
        f"{nbytes / 2**20:.0f} MiB, replica copy {nbytes / seconds_copy / 1e9:.1f} GB/s, "
        f"hand-off + copy + hash {nbytes / total / 1e9:.2f} GB/s",
    )


def _engine_rank(port: int, backend: str, out) -> None:
    """Rank 1 of an engine-protocol group: the receiving side as the engines' workers build it."""
    from datetime import timedelta

    import torch.distributed as dist

    from meshrl.common.weights.engine_group import broadcast_all, engine_process_group
    from meshrl.common.weights.transport import Deadline

    device = "cuda:1" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(1)
    store = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=60))
    pg = engine_process_group(backend, store, 1, 2, "gpu-check", 60.0)
    t = torch.empty(1 << 20, dtype=torch.float32, device=device)
    broadcast_all(pg, [t], Deadline(60, "receive"))
    out.put(float(t.double().sum()))


def engine_group(backend: str) -> None:
    from meshrl.common.net import free_port
    from meshrl.common.weights import GroupSpec
    from meshrl.common.weights.engine_group import EngineGroupSender, broadcast_all
    from meshrl.common.weights.transport import Deadline

    port = free_port()
    ctx = mp.get_context(_start_method("cuda" if backend == "nccl" else "cpu"))
    out = ctx.Queue()
    proc = ctx.Process(target=_engine_rank, args=(port, backend, out))
    proc.start()
    sender = EngineGroupSender.join(GroupSpec("127.0.0.1", port, 2, 0, "gpu-check", backend, 60.0, "engine"))
    x = torch.arange(1 << 20, dtype=torch.float32, device=sender.device)
    start = time.perf_counter()
    broadcast_all(sender.pg, [x], Deadline(60, "send"))
    got = out.get(timeout=120)
    proc.join(60)
    sender.destroy()
    check(
        f"engine weight group over {backend} (2 ranks)",
        got == float(x.double().sum()),
        f"4 MiB in {time.perf_counter() - start:.3f}s",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda", help="cuda or cpu (the CI twin)")
    ap.add_argument("--mib", type=int, default=512, help="size of the colocated publication")
    args = ap.parse_args()
    from meshrl.trainer.model_builder import build_small_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_small_model(tmp, hidden_size=64, num_layers=2, max_position_embeddings=128, seed=3)
        generation(Path(model_dir), "cuda:0" if args.device == "cuda" else "cpu")
    colocated_publication("cuda:0" if args.device == "cuda" else "cpu", args.mib)
    if args.device == "cpu":
        engine_group("gloo")
    elif torch.cuda.device_count() >= 2:
        engine_group("nccl")
    else:
        print(f"SKIP NCCL between two ranks needs two GPUs; {torch.cuda.device_count()} present", flush=True)


if __name__ == "__main__":
    main()
