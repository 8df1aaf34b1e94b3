"""Bodies of the processes the weight-plane tests spawn (trainer rank 0 and replica ranks).

Each member reports to the test through a multiprocessing queue as (role, event, payload) and,
where the test drives several phases, waits for commands on its own queue.
"""

from __future__ import annotations

import os
import time

import torch

NAMES = [
    "model.embed_tokens.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.1.self_attn.q_proj.bias",
    "lm_head.weight",
    "model.norm.weight",
]


def make_tensors(seed: int, scale: int = 1) -> list[tuple[str, torch.Tensor]]:
    """A tiny Llama-like export, deterministic per seed; `scale` grows the two big matrices."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(64 * scale, 16), (48 * scale, 16), (16,), (16,), (64, 16), (16,)]
    dtypes = [torch.float32, torch.bfloat16, torch.float32, torch.float16, torch.float32, torch.bfloat16]
    return [(n, torch.randn(s, generator=g).to(d)) for n, s, d in zip(NAMES, shapes, dtypes, strict=True)]


def zeros_like(tensors: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {n: torch.zeros_like(t) for n, t in tensors}


def equal(params: dict[str, torch.Tensor], tensors: list[tuple[str, torch.Tensor]]) -> bool:
    return set(params) == {n for n, _ in tensors} and all(torch.equal(params[n], t) for n, t in tensors)


def _all_checksums(params) -> dict[str, str]:
    from meshrl.common.weights import tensor_checksums

    table = dict(params)
    return tensor_checksums(table, names=sorted(table))


# ---------------------------------------------------------------------------- happy path
def happy_sender(plan, results) -> None:
    """v1 (flat, many buckets), v2 (per-tensor: matrices direct, vectors coalesced), v1 again
    (refused: older), v3 (one bucket)."""
    from meshrl.common.weights import UpdateRefused, WeightGroup, WeightGroupOptions

    opts = WeightGroupOptions(bucket_bytes=4096, init_timeout_s=120, coalesce_bytes=256)
    group = WeightGroup.join(plan.sender, options=opts)
    try:
        out = [group.send(iter(make_tensors(1)), 1, layout_name="flat").acked]
        out.append(group.send(make_tensors(2), 2, layout_name="per_tensor").acked)
        try:
            group.send(make_tensors(1), 1)
            out.append("not refused")
        except UpdateRefused as e:
            out.append(sorted(e.outcome.refused))
        out.append(group.send(make_tensors(3), 3, bucket_bytes=1 << 20).acked)
        results.put(("sender", "done", (out, _all_checksums(make_tensors(3)))))
    finally:
        group.destroy()


def happy_receiver(plan, replica_id, results) -> None:
    from meshrl.common.weights import InPlaceSink, WeightGroup, WeightGroupOptions

    params = zeros_like(make_tensors(0))
    group = WeightGroup.join(plan.replica_spec(replica_id), options=WeightGroupOptions(init_timeout_s=120))
    try:
        sink = InPlaceSink(params, 0)
        out = [(group.receive(sink, 60), equal(params, make_tensors(1)))]
        out.append((group.receive(sink, 60), equal(params, make_tensors(2))))
        try:
            group.receive(sink, 60)
            out.append("accepted v1")
        except Exception as e:  # InvalidArgument from the sink: version 1 < 2
            out.append((type(e).__name__, sink.version, equal(params, make_tensors(2))))
        out.append((group.receive(sink, 60), equal(params, make_tensors(3))))
        results.put((replica_id, "done", (out, _all_checksums(params))))
    finally:
        group.destroy()


def disk_receiver(weights_bytes, staging_dir, results, replica_id) -> None:
    from meshrl.api.common.v1 import weights_pb2
    from meshrl.common.weights import load_version

    disk = weights_pb2.DiskWeights.FromString(weights_bytes)
    disk.local_staging_dir = staging_dir
    params = zeros_like(make_tensors(1))
    version = load_version(params, disk, current_version=0)
    results.put((replica_id, "done", (version, equal(params, make_tensors(1)), _all_checksums(params))))


# ---------------------------------------------------------------------------- frozen member
def frozen_sender(plan, disk_root, commands, results) -> None:
    """Trainer: v1 to all, v2 while r2 freezes itself, then v2 again over a fresh group without r2."""
    from meshrl.common.weights import MembersUnresponsive, WeightGroup, WeightGroupOptions, write_version

    opts = WeightGroupOptions(bucket_bytes=4 << 20, grace_s=1.5, init_timeout_s=120)
    disk = write_version(disk_root, 2, make_tensors(2, scale=4096), keep_last=2)  # for refits
    group = WeightGroup.join(plan.sender, options=opts)
    group.send(make_tensors(1, scale=4096), 1)
    results.put(("sender", "v1", None))
    start = time.monotonic()
    try:
        group.send(make_tensors(2, scale=4096), 2)
        results.put(("sender", "v2", "no error"))
    except MembersUnresponsive as e:
        results.put(("sender", "v2", (time.monotonic() - start, e.outcome.unresponsive, str(e))))
    finally:
        group.destroy()
    new_plan = commands.get(timeout=120)
    with WeightGroup.join(new_plan.sender, options=opts) as fresh:
        outcome = fresh.send(make_tensors(2, scale=4096), 2)
    results.put(("sender", "redo", (outcome.acked, disk.SerializeToString())))


def frozen_receiver(plan, replica_id, freeze, commands, results) -> None:
    """Replica: receives v1; during v2 the `freeze` one waits in its sink while the test stops it."""
    from meshrl.common.weights import InPlaceSink, WeightGroup, WeightGroupOptions, load_version
    from meshrl.common.weights.sink import WeightSink

    params = zeros_like(make_tensors(1, scale=4096))

    class FreezingSink(InPlaceSink):
        def begin(self, version: int) -> None:
            super().begin(version)
            if freeze and version == 2:  # inside the update, before its first 16 MB bucket:
                results.put((replica_id, "freezing", os.getpid()))  # the test SIGSTOPs us now
                commands.get(timeout=120)  # ... and lets us go on after SIGCONT

    sink: WeightSink = FreezingSink(params, 0)
    opts = WeightGroupOptions(init_timeout_s=120)
    group = WeightGroup.join(plan.replica_spec(replica_id), options=opts)
    group.receive(sink, timeout=60)
    results.put((replica_id, "v1", equal(params, make_tensors(1, scale=4096))))
    try:
        results.put((replica_id, "v2", ("ok", group.receive(sink, timeout=30), sink.touched)))
    except Exception as e:
        results.put((replica_id, "v2", (type(e).__name__, sink.version, sink.touched)))
    finally:
        group.destroy()
    command = commands.get(timeout=120)
    if command[0] == "rejoin":
        with WeightGroup.join(command[1].replica_spec(replica_id), options=opts) as fresh:
            version = fresh.receive(sink, timeout=60)
    else:  # refit from the version the trainer published on disk
        from meshrl.api.common.v1 import weights_pb2

        version = load_version(params, weights_pb2.DiskWeights.FromString(command[1]), sink.version)
    results.put((replica_id, "final", (version, equal(params, make_tensors(2, scale=4096)))))


def run(role: str, target, results, *args) -> None:
    """Runs a member body; reports its traceback to the test instead of dying silently."""
    import traceback

    try:
        target(*args)
    except BaseException:
        results.put((role, "error", traceback.format_exc()))
        raise
