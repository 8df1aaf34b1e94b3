"""Weight-plane benchmark: meshrl's publication vs. the raw operation on the same bytes, side by side.

    .venv/bin/python bench/weights/run.py                      # ~10M, ~100M, ~500M parameters, bf16
    .venv/bin/python bench/weights/run.py --sizes 10M --reps 2 # quick run

disk:        write_version + load_version (atomic folder, an xxh3-128 digest per tensor written and
             verified before anything is copied, then copied from the file's mapping into the live
             parameters) vs. safetensors save_file + load_file of the same tensors (the target's
             ratio; load_file maps the file lazily and touches no byte), and also vs. save_file +
             load_file + a copy into the replica's parameters, which a replica must do too ("raw
             +copy in"). "+fsync": write_version(fsync=True) + load_version, what durability costs
             (neither raw side fsyncs); "write" and "load" split the default run.
distributed: WeightGroup.send -> receive into live parameters (metadata, buckets, confirmation):
             "ours (stream)", the default CPU wire (one TCP stream, every tensor straight into its
             parameter), and on a second group kept on gloo operations (cpu_wire="gloo") the flat and
             per-tensor layouts; each vs. one torch.distributed.broadcast of a flat tensor of the
             same bytes on the default group (the target's ratio), between 2 processes over gloo on this
             host; also vs. "raw per-tensor": one raw broadcast per tensor, all in flight, straight into
             the receiver's tensors, which is what landing in separate parameters without a copy costs
             on gloo before any of meshrl's work.
delta:       after one AdamW step of a real model (bf16 export), a delta version vs a complete one:
             bytes, publication time, and the pause (apply) apart from the transfer (delta_bench.py).
dcoll:       the same over a gloo weight group: delta ÷ complete publication time and bytes, the pause
             (apply) apart from encode and transfer+decode (delta_collective_bench.py).
Raw and meshrl alternate within each repetition; the table shows medians and, in brackets, the
ratio of the best runs (the machine is shared, so both are noisy). The distributed runs first
warm up once. Ratios > 1 mean slower than raw; targets: disk <= 1.5, distributed <= 1.25.
Nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from delta_bench import MODELS, bench_delta, print_delta
from delta_collective_bench import bench_delta_collective, print_delta_collective

from meshrl.common.net import free_port
from meshrl.common.weights.wire import DEFAULT_COALESCE_BYTES

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# hidden size, layers, vocab: a Llama-shaped set of about that many parameters
SHAPES = {"10M": (256, 7, 8192), "100M": (768, 7, 32000), "500M": (1024, 34, 32000)}


def model_tensors(size: str, dtype: torch.dtype, seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    h, layers, vocab = SHAPES[size]
    inter = 8 * h // 3
    g = torch.Generator().manual_seed(seed)
    shapes = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
        shapes += [(p + f"self_attn.{x}_proj.weight", (h, h)) for x in "qkvo"]
        shapes += [(p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h))]
        shapes += [(p + "mlp.down_proj.weight", (h, inter))]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    return [(n, torch.empty(s, dtype=dtype).uniform_(-1, 1, generator=g)) for n, s in shapes]


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for _, t in tensors)


# --------------------------------------------------------------------------------------------- disk
def bench_disk(size: str, dtype: torch.dtype, reps: int, workdir: str, bucket_bytes: int) -> dict[str, list[float]]:
    from safetensors.torch import load_file, save_file

    from meshrl.common.weights import load_version, write_version

    tensors = model_tensors(size, dtype)
    params = {n: torch.zeros_like(t) for n, t in tensors}  # the replica's live model
    raw_params = {n: torch.zeros_like(t) for n, t in tensors}  # the raw side's, as warm as ours
    raw, raw_in, ours, write, load, synced = [], [], [], [], [], []
    for rep in range(reps):
        root = os.path.join(workdir, f"disk-{size}")
        path = os.path.join(workdir, f"raw-{size}.safetensors")
        t0 = time.perf_counter()
        save_file(dict(tensors), path)
        loaded = load_file(path)
        raw.append(time.perf_counter() - t0)
        del loaded
        os.remove(path)
        gc.collect()
        t0 = time.perf_counter()  # the same, then copied into the replica's parameters (load_file maps lazily)
        save_file(dict(tensors), path)
        with torch.no_grad():
            for name, tensor in load_file(path).items():
                raw_params[name].copy_(tensor)
        raw_in.append(time.perf_counter() - t0)
        os.remove(path)
        gc.collect()
        t0 = time.perf_counter()
        disk = write_version(root, rep + 1, tensors, keep_last=0, bucket_bytes=bucket_bytes)
        t1 = time.perf_counter()
        load_version(params, disk, current_version=rep)
        t2 = time.perf_counter()
        ours.append(t2 - t0)
        write.append(t1 - t0)
        load.append(t2 - t1)
        shutil.rmtree(root)  # deleting is outside the timing for both
        gc.collect()
        t0 = time.perf_counter()
        disk = write_version(root, rep + 1, tensors, keep_last=0, bucket_bytes=bucket_bytes, fsync=True)
        load_version(params, disk, current_version=rep)
        synced.append(time.perf_counter() - t0)
        shutil.rmtree(root)
        gc.collect()
    assert all(torch.equal(params[n], t) for n, t in tensors), "disk publication was not bit-exact"
    return {"raw": raw, "raw_in": raw_in, "ours": ours, "write": write, "load": load, "synced": synced}


# -------------------------------------------------------------------------------------- distributed
def _member(
    rank: int,
    size: str,
    dtype_name: str,
    reps: int,
    ports: tuple[int, int],
    bucket_bytes: int,
    coalesce: list[int],
    out,
) -> None:
    import dataclasses

    from meshrl.common.weights import GroupPlan, InPlaceSink, WeightGroup, WeightGroupOptions

    torch.set_num_threads(1)
    dtype = DTYPES[dtype_name]
    store = dist.TCPStore("127.0.0.1", ports[0], 2, rank == 0, timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)  # the raw baseline's group
    groups = {}
    for wire, port in (("stream", ports[1]), ("gloo", ports[2])):  # the default wire, and gloo operations
        plan = GroupPlan.build([("r", 1)], "127.0.0.1", port, f"bench-{wire}", "gloo", 300.0)
        options = WeightGroupOptions(bucket_bytes=bucket_bytes, coalesce_bytes=coalesce[0], cpu_wire=wire)
        groups[wire] = WeightGroup.join(plan.sender if rank == 0 else plan.replica_spec("r"), options=options)
    if not groups["stream"].streaming or groups["gloo"].streaming:
        raise SystemExit("the stream group does not stream, or the gloo group does")
    tensors = model_tensors(size, dtype)
    total = nbytes(tensors)
    flat = torch.ones(total, dtype=torch.uint8) if rank == 0 else torch.zeros(total, dtype=torch.uint8)
    params = {n: torch.zeros_like(t) for n, t in tensors} if rank else {}
    sink = InPlaceSink(params, 0) if rank else None
    raw_each = tensors if rank == 0 else [(n, torch.zeros_like(t)) for n, t in tensors]  # raw_multi's targets
    times: dict[str, list[float]] = {
        "raw": [],
        "raw_multi": [],
        "stream": [],
        "flat": [],
        **{f"per_tensor@{c}": [] for c in coalesce},
    }
    version = 0
    for rep in range(reps + 1):  # the first round warms buffers and connections up
        for kind in times:
            dist.barrier()
            t0 = time.perf_counter()
            if kind == "raw":
                dist.broadcast(flat, src=0)
            elif kind == "raw_multi":  # one broadcast per tensor, all in flight at once, into its own memory
                for work in [dist.broadcast(t, src=0, async_op=True) for _, t in raw_each]:
                    work.wait()
            elif rank == 0:
                version += 1
                layout, _, threshold = kind.partition("@")
                group = groups["stream" if kind == "stream" else "gloo"]
                if threshold:  # the sender's choice rides in each bucket's header; receivers follow it
                    group.options = dataclasses.replace(group.options, coalesce_bytes=int(threshold))
                group.send(tensors, version, layout_name="per_tensor" if kind == "stream" else layout)
            else:
                version = groups["stream" if kind == "stream" else "gloo"].receive(sink, timeout=300)
            if rep:
                times[kind].append(time.perf_counter() - t0)
    if rank:
        out.put(("exact", all(torch.equal(params[n], t) for n, t in tensors)))
    else:
        out.put(("times", times))
    for group in groups.values():
        group.destroy()
    dist.destroy_process_group()


def bench_distributed(
    size: str, dtype_name: str, reps: int, bucket_bytes: int, coalesce: list[int]
) -> dict[str, list[float]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ports = (free_port(), free_port(), free_port())
    procs = [
        ctx.Process(target=_member, args=(r, size, dtype_name, reps, ports, bucket_bytes, coalesce, out))
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(60)
    if not results.get("exact"):
        raise SystemExit("distributed publication was not bit-exact")
    return results["times"]


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10M,100M,500M", help=f"comma-separated, from {list(SHAPES)}")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="dtype of every tensor")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per measurement (median)")
    parser.add_argument("--bucket-mb", type=int, default=512, help="bucket size of both transports, MiB")
    parser.add_argument(
        "--coalesce-kb",
        default=str(DEFAULT_COALESCE_BYTES // 1024),
        help="per-tensor layout: tensors below this many KiB travel packed in one buffer; "
        "several, comma-separated, are measured side by side",
    )
    parser.add_argument("--workdir", default=None, help="folder for the disk runs (default: a temp folder)")
    parser.add_argument(
        "--skip",
        choices=["disk", "distributed", "delta", "dcoll"],
        action="append",
        default=[],
        help="leave a section out (repeatable)",
    )
    parser.add_argument("--delta-model", default="100M", choices=sorted(MODELS), help="model of the delta section")
    parser.add_argument("--delta-lrs", default="1e-6,1e-5,1e-3", help="learning rates of the delta section")
    args = parser.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown sizes {unknown}; choose from {list(SHAPES)}")
    bucket = args.bucket_mb * 1024**2
    coalesce = [int(x) * 1024 for x in args.coalesce_kb.split(",") if x.strip()]
    workdir = args.workdir or tempfile.mkdtemp(prefix="meshrl-bench-weights-")
    rows = []
    try:
        for size in sizes:
            n = _param_count(size)
            row = {"size": size, "params": n, "bytes": n * DTYPES[args.dtype].itemsize}
            if "disk" not in args.skip:
                row["disk"] = bench_disk(size, DTYPES[args.dtype], args.reps, workdir, bucket)
            gc.collect()
            if "distributed" not in args.skip:
                row["dist"] = bench_distributed(size, args.dtype, args.reps, bucket, coalesce)
            rows.append(row)
            print(f"measured {size}", file=sys.stderr, flush=True)
        if "delta" not in args.skip:
            lrs = [float(x) for x in args.delta_lrs.split(",") if x.strip()]
            delta_rows = bench_delta(args.delta_model, lrs, workdir)
        if "dcoll" not in args.skip:
            lrs = [float(x) for x in args.delta_lrs.split(",") if x.strip()]
            dcoll_rows = bench_delta_collective(args.delta_model, lrs)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    _print(rows, args)
    if "delta" not in args.skip:
        print_delta(args.delta_model, delta_rows)
    if "dcoll" not in args.skip:
        print_delta_collective(args.delta_model, dcoll_rows)


def _param_count(size: str) -> int:
    h, layers, vocab = SHAPES[size]
    inter = 8 * h // 3
    return 2 * vocab * h + h + layers * (2 * h + 4 * h * h + 3 * h * inter)


def _cell(times: dict[str, list[float]], key: str) -> str:
    return f"{statistics.median(times[key]):.3f}"


def _ratio(times: dict[str, list[float]], key: str, base: str = "raw") -> str:
    med = statistics.median(times[key]) / statistics.median(times[base])
    best = min(times[key]) / min(times[base])
    return f"{med:.2f} ({best:.2f})"


def _print(rows: list[dict], args) -> None:
    print(
        f"\nweight publication, {args.dtype}, bucket {args.bucket_mb} MiB, coalesce {args.coalesce_kb} KiB, "
        f"{args.reps} reps: median seconds, ratio to raw as median (best)"
    )
    if "disk" not in args.skip:
        print(
            "\nDISK    size      params      MiB | raw save+load | ours write+load   ratio       | write   load "
            "| raw +copy in  ours / that   | +fsync  / raw"
        )
        for r in rows:
            d = r["disk"]
            print(
                f"       {r['size']:>5} {r['params']:>11,} {r['bytes'] / 2**20:>8.0f} | {_cell(d, 'raw'):>13} | "
                f"{_cell(d, 'ours'):>15}   {_ratio(d, 'ours'):<11} | {_cell(d, 'write')}  {_cell(d, 'load')} "
                f"| {_cell(d, 'raw_in'):>12}  {_ratio(d, 'ours', 'raw_in'):<11} | {_cell(d, 'synced'):>6}  "
                f"{_ratio(d, 'synced')}"
            )
    if "distributed" not in args.skip:
        kinds = [k for k in rows[0]["dist"] if k.startswith("per_tensor@")] if rows else []
        heads = "".join(
            f" | gloo ops, <{int(k.split('@')[1]) // 1024} KiB packed ratio       / raw per-tensor" for k in kinds
        )
        print(
            f"\nDIST    size      params      MiB | raw broadcast | ours (stream) ratio       | raw per-tensor ratio      "
            f"{heads} | gloo flat  ratio"
        )
        for r in rows:
            d = r["dist"]
            cells = "".join(f" | {_cell(d, k):>23}  {_ratio(d, k):<11} {_ratio(d, k, 'raw_multi'):<11}" for k in kinds)
            print(
                f"       {r['size']:>5} {r['params']:>11,} {r['bytes'] / 2**20:>8.0f} | {_cell(d, 'raw'):>13} | "
                f"{_cell(d, 'stream'):>13} {_ratio(d, 'stream'):<11} | "
                f"{_cell(d, 'raw_multi'):>14} {_ratio(d, 'raw_multi'):<11}{cells} | {_cell(d, 'flat'):>9}  {_ratio(d, 'flat')}"
            )
    print(
        "\ntargets: disk <= 1.5, distributed <= 1.25. meshrl also hashes every tensor, verifies before it copies into "
        "the live parameters, and confirms each update; raw does none of that."
    )


if __name__ == "__main__":
    main()
