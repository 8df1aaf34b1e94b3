"""The DCOLL section of bench/weights/run.py: delta vs complete publication over a weight group.

The same model and optimizer step as delta_bench.py (a Llama-shaped model, one AdamW step at each
learning rate, bf16 export). A gloo WeightGroup of two members on threads of this process (loopback)
carries version 1 complete (recorded as the trainer's delta base), then version 2 twice:
complete: WeightGroup.send of every tensor straight into the replica's parameters; the transformers
  engine pauses for all of it (pause = transfer).
delta: delta_update (encode against the base) + send of the two delta tensors, the replica receiving
  and decoding them while it would still generate (DeltaOrFullSink), then apply_delta: the pause.
Publish times run from the trainer's first byte to the replica holding version 2. Replica checksums
of every tensor must equal the trainer's after each, or the run stops.
"""

from __future__ import annotations

import gc
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from delta_bench import _export, _model, _step, print_table


def _pair(pool):
    from meshrl.common.net import free_port
    from meshrl.common.weights import GroupPlan, WeightGroup

    plan = GroupPlan.build([("r", 1)], "127.0.0.1", free_port(), "bench", "gloo", 300.0)
    receiver = pool.submit(WeightGroup.join, plan.replica_spec("r"))
    sender = WeightGroup.join(plan.sender)
    return sender, receiver.result(120)


def bench_delta_collective(size: str, lrs: list[float], tokens: int = 256) -> list[dict]:
    from meshrl.common.weights import DeltaBase, DeltaOrFullSink, InPlaceSink, apply_delta, delta_update
    from meshrl.common.weights import tensor_checksums as sums

    model = _model(size)
    start_state = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        sender, receiver = _pair(pool)
        try:
            for lr in lrs:
                with torch.no_grad():
                    for n, p in model.named_parameters():
                        p.copy_(start_state[n])
                v1 = _export(model)
                replica = {n: torch.zeros_like(t) for n, t in v1}
                names = sorted(replica)
                base = DeltaBase()
                got = pool.submit(receiver.receive, InPlaceSink(replica, 0))
                sender.send(base.record(1, v1), 1)
                got.result(300)
                del v1
                _step(model, lr, tokens)
                v2 = _export(model)
                expected = sums(dict(v2), names=names)
                # complete publication of v2 (paused throughout on the replica)
                gc.collect()
                t0 = time.perf_counter()
                got = pool.submit(receiver.receive, InPlaceSink(replica, 1))
                sender.send(v2, 2)
                got.result(300)
                full_s = time.perf_counter() - t0
                if sums(replica, names=names) != expected:
                    raise SystemExit(f"complete at lr {lr:g}: replica checksums differ from the trainer's")
                full_bytes = sum(t.numel() * t.element_size() for _, t in v2)
                with torch.no_grad():  # back to version 1 for the delta
                    for n, t in base.tensors.items():
                        replica[n].copy_(t)
                # delta publication of v2 against v1: pause only for apply_delta
                gc.collect()
                sink = DeltaOrFullSink(InPlaceSink(replica, 1), lambda: None)
                t0 = time.perf_counter()
                wire, stats = delta_update(base, 2, v2, 1.0)
                t1 = time.perf_counter()
                got = pool.submit(receiver.receive, sink)
                sender.send(wire, 2)
                got.result(300)
                t2 = time.perf_counter()
                apply_delta(replica, sink.staged)
                t3 = time.perf_counter()
                if sums(replica, names=names) != expected:
                    raise SystemExit(f"delta at lr {lr:g}: replica checksums differ from the trainer's")
                rows.append(
                    {
                        "lr": lr,
                        "params": stats.elements,
                        "changed": stats.changed / stats.elements,
                        "full_bytes": full_bytes,
                        "delta_bytes": sum(t.numel() for _, t in wire),
                        "full": {"publish": full_s, "pause": full_s},
                        "delta": {"publish": t3 - t0, "encode": t1 - t0, "transfer": t2 - t1, "pause": t3 - t2},
                        "exact": True,  # checked above
                    }
                )
                del v2, wire, sink, base, replica
                gc.collect()
        finally:
            sender.destroy()
            receiver.destroy()
    return rows


def print_delta_collective(size: str, rows: list[dict]) -> None:
    print_table(
        f"DCOLL   {size} Llama over a gloo weight group",
        rows,
        ("encode", "transfer"),
        "delta bytes include its manifest; transfer includes the replica's decode (while generating); the "
        "complete version's pause is its whole transfer (the engine pauses before the first tensor lands).",
    )
