"""Put+get throughput of the data buffer service vs. raw redis-py SET/GET of the same bytes,
side by side in one run on the same Redis, for 1 MiB, 64 MiB and 512 MiB batches, through both data paths:
relayed (the payload goes client -> service -> Redis, the default) and direct (the client moves the payload
to and from Redis itself: meshrl.common.direct_path). On the direct path a batch of at most the service's
embed_max_bytes (4 MiB by default: the 1 MiB row) makes no service RPC at all (meshrl.common.zero_rpc: the
service's own scripts by EVALSHA); a larger one (64 MiB) stages chunks and makes one RPC per put and per get.

The raw side uses redis-py as the service does (hiredis reply parser, Python command packer,
which sends large values without copying them). The service runs as its own process (`python -m meshrl.databuffer`), as deployed; the client
and the raw redis-py calls run here. Each repeat alternates which side goes first; the
figures are medians. Targets (issue 22): >= 0.7 of raw at 1 MiB and >= 0.9 at 64 MiB. The relayed path cannot
reach them (a bare 1 MiB gRPC echo costs more than raw SET+GET here); the ratios printed with the targets are
the direct path's, and the printed bound is what a design with one RPC per put and per get could reach (the
zero-RPC path is not bound by it). Both sides' gets return what they return: raw redis-py a bytes object,
meshrl writable arrays (one copy of the payload, as on every path of DataBufferClient.get).

    .venv/bin/python bench/databuffer/run.py [--sizes 1 64] [--repeats 3] [--redis-url redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import redis

from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.batch_key import batch_key
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.common.direct_path import DirectPathConfig
from meshrl.common.redis_connections import CONNECTION_CLASSES

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests._databuffer
from tests._databuffer import delete_prefix  # noqa: E402

MiB = 1 << 20
TARGETS = {1: "   target >= 0.7", 64: "   target >= 0.9"}


def start_service(redis_url: str, prefix: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    port_file = workdir / "port"
    args = [sys.executable, "-m", "meshrl.databuffer", "--port", "0", "--set", f"server.port_file={port_file}"]
    args += [
        "--set",
        f"redis.url={redis_url}",
        "--set",
        f"redis.key_prefix={prefix}",
        "--set",
        "budget.max_bytes=8589934592",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(workdir / "service.log", "w"))
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the service did not start: {(workdir / 'service.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port_file.read_text()}"


def time_raw(client: redis.Redis, key: str, data: memoryview) -> tuple[float, float]:
    t0 = time.perf_counter()
    client.set(key, data)
    t1 = time.perf_counter()
    got = client.get(key)
    t2 = time.perf_counter()
    assert len(got) == data.nbytes
    client.delete(key)
    return t1 - t0, t2 - t1


def time_service(client: DataBufferClient, step: int, data: np.ndarray) -> tuple[float, float]:
    key = batch_key("bench", step, "direct" if client.direct_config else "payload")
    t0 = time.perf_counter()
    client.put(key, {"payload": data}, timeout=600)
    t1 = time.perf_counter()
    got = client.get(key, timeout=600)["payload"]
    t2 = time.perf_counter()
    assert got.nbytes == data.nbytes
    client.delete(key)
    return t1 - t0, t2 - t1


def time_control_rpc(client: DataBufferClient) -> float:
    """Seconds of one control RPC with no Redis work and no payload (DescribeDirectPath): the floor that any
    design with a service call per put or get pays on this machine."""
    t0 = time.perf_counter()
    client._stub.DescribeDirectPath(pb.DescribeDirectPathRequest(), timeout=30)
    return time.perf_counter() - t0


def rates(size_mib: int, times: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Median MiB/s of put, of get, and of put+get (2 x size over both times)."""
    put = statistics.median(size_mib / p for p, _ in times)
    get = statistics.median(size_mib / g for _, g in times)
    both = statistics.median(2 * size_mib / (p + g) for p, g in times)
    return put, get, both


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 64], help="batch sizes in MiB (e.g. 1 64 512)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()

    prefix = f"mdbbench-{uuid.uuid4().hex[:8]}"
    # raw redis-py at its fastest: hiredis parses replies, values are sent without a packing copy (as the service does)
    raw = redis.Redis.from_url(args.redis_url, connection_class=CONNECTION_CLASSES[args.redis_url.partition("://")[0]])
    workdir = Path(tempfile.mkdtemp(prefix="mdb-bench-"))
    proc, address = start_service(args.redis_url, prefix, workdir)
    relayed = DataBufferClient(address)
    relayed.wait_until_ready(30)
    direct = DataBufferClient(address, direct=DirectPathConfig(redis_url=args.redis_url, fallback=False))
    clients = {"relayed": relayed, "direct": direct}
    zero = direct.direct_path().zero
    embed = zero.embed_max_bytes if zero is not None else -1  # batches up to this size: no RPC on the direct path
    print(
        f"redis {args.redis_url} (server {raw.info('server')['redis_version']}), service {address}, pid {os.getpid()}"
    )
    print(
        f"{'size':>8} | {'raw put':>8} {'raw get':>8} {'raw p+g':>8} | {'relayed p+g':>11} {'ratio':>5} | "
        f"{'direct put':>10} {'get':>7} {'p+g':>7} {'ratio':>5}"
    )
    try:
        step = 0
        for size_mib in args.sizes:
            data = np.random.default_rng(size_mib).integers(0, 256, size=size_mib * MiB, dtype=np.uint8)
            view = memoryview(data)
            time_raw(raw, f"{prefix}:raw", view[: min(view.nbytes, MiB)])  # warm connections
            for client in clients.values():
                time_service(client, step, data[:MiB])
            times: dict[str, list[tuple[float, float]]] = {"raw": [], "relayed": [], "direct": []}
            sides = list(times)
            rpc: list[float] = []
            for rep in range(args.repeats * max(1, 16 // size_mib)):  # small sizes: more repeats, same noise
                for side in sides[rep % 3 :] + sides[: rep % 3]:  # each side goes first in turn
                    step += 1
                    if side == "raw":
                        times[side].append(time_raw(raw, f"{prefix}:raw", view))
                    else:
                        times[side].append(time_service(clients[side], step, data))
                rpc.append(time_control_rpc(relayed))

            r, rel, d = (rates(size_mib, times[side]) for side in sides)
            print(
                f"{size_mib:>5}MiB | {r[0]:>6.0f}MB {r[1]:>6.0f}MB {r[2]:>6.0f}MB | {rel[2]:>9.0f}MB {rel[2] / r[2]:>5.2f} | "
                f"{d[0]:>8.0f}MB {d[1]:>5.0f}MB {d[2]:>5.0f}MB {d[2] / r[2]:>5.2f}{TARGETS.get(size_mib, '')}",
                flush=True,
            )
            raw_s, rpc_s = statistics.median(p + g for p, g in times["raw"]), statistics.median(rpc)
            print(
                f"{'':>8}   one control RPC {rpc_s * 1e3:.2f} ms, raw put+get {raw_s * 1e3:.2f} ms: a design with "
                f"one service call per put and per get reaches at most {raw_s / (raw_s + 2 * rpc_s):.2f}"
                f"{' (the direct path makes none at this size)' if size_mib * MiB <= embed else ''}"
            )
            del data, view
    finally:
        for client in clients.values():
            client.close()
        proc.terminate()
        proc.wait(30)
        delete_prefix(raw, prefix)
        raw.delete(f"{prefix}:raw")
    print("MB = MiB/s; p+g = 2 x size / (put time + get time), median over repeats")


if __name__ == "__main__":
    main()
