"""Step time with tracing on (file exporter) vs off, measured side by side in one run.

A synthetic training step runs against two real gRPC server processes (one traced, one not):
6 DAG nodes, each with local work, 3 unary calls and one 8-message server stream, so a step
makes ~60 spans across two processes like a small meshrl step. Steps alternate off/on in pairs (order
flipped every pair) and the medians are compared. Also prints the per-span and per-call cost.
The issue's target is a ratio <= 1.03. Run: .venv/bin/python bench/tracing/bench_tracing.py

`--job` measures a real GRPO job instead: two jobs with their own services, tracing on (file) and off,
whose steps take turns (bench/tracing/job_pair.py). Run: .venv/bin/python bench/tracing/bench_tracing.py --job
"""

from __future__ import annotations

import argparse
import hashlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from meshrl.common import telemetry as T
from meshrl.common.telemetry.attributes import NODE_ID, STEP, node_span_name, step_span_name

sys.path.insert(0, str(Path(__file__).resolve().parent))
import job_pair  # noqa: E402  (bench/tracing/job_pair.py, beside this script)

SERVICE = "meshrl.bench.Work"
PAYLOAD = b"x" * (256 * 1024)


def _work(rounds: int) -> bytes:
    digest = b""
    for _ in range(rounds):
        digest = hashlib.sha256(PAYLOAD + digest).digest()
    return digest


def serve(trace_file: str | None, port_file: str) -> None:
    cfg = T.TelemetryConfig(exporter="file", path=trace_file) if trace_file else T.TelemetryConfig()
    T.setup_telemetry("bench-server", cfg)

    def unary(request: bytes, context) -> bytes:
        with T.tracer().start_as_current_span("server.work"):
            return _work(int(request))

    def stream(request: bytes, context):
        for _ in range(8):
            yield _work(int(request))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[T.server_interceptor()])
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    Path(port_file + ".tmp").write_text(str(port))
    Path(port_file + ".tmp").rename(port_file)
    stop.wait()
    server.stop(grace=1).wait()
    T.shutdown_telemetry()


def _start_server(tmp: Path, name: str, traced: bool) -> tuple[subprocess.Popen, grpc.Channel]:
    port_file = tmp / f"{name}.port"
    cmd = [sys.executable, __file__, "--serve", "--port-file", str(port_file)]
    if traced:
        cmd += ["--trace-file", str(tmp / "traces" / f"{name}.jsonl")]
    proc = subprocess.Popen(cmd)
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"bench server {name} exited with {proc.returncode}")
        time.sleep(0.05)
    channel = grpc.intercept_channel(
        grpc.insecure_channel(f"127.0.0.1:{port_file.read_text()}"), *T.client_interceptors()
    )
    return proc, channel


def run_step(step: int, channel: grpc.Channel, nodes: int, work: int) -> float:
    unary = channel.unary_unary(f"/{SERVICE}/Unary")
    stream = channel.unary_stream(f"/{SERVICE}/Stream")
    start = time.perf_counter()
    with T.tracer().start_as_current_span(step_span_name(step), attributes={STEP: step}):
        for n in range(nodes):
            with T.tracer().start_as_current_span(node_span_name(f"n{n}"), attributes={NODE_ID: f"n{n}"}):
                _work(work)
                for _ in range(3):
                    unary(str(work).encode(), timeout=30)
                for _ in stream(str(max(1, work // 4)).encode(), timeout=30):
                    pass
    return time.perf_counter() - start


def span_cost(n: int = 20000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        with T.tracer().start_as_current_span("s"):
            pass
    return (time.perf_counter() - start) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="steps per mode (run in off/on pairs)")
    p.add_argument("--nodes", type=int, default=6)
    p.add_argument("--work", type=int, default=40, help="sha256 rounds over 256 KiB per unit of work")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--trace-file", help=argparse.SUPPRESS)
    p.add_argument("--port-file", help=argparse.SUPPRESS)
    p.add_argument("--job", action="store_true", help="measure a real GRPO job (tracing on vs off) instead")
    job_pair.add_arguments(p)
    args = p.parse_args()
    if args.job:
        job_pair.run(args)
        return
    if args.serve:
        serve(args.trace_file, args.port_file)
        return
    with tempfile.TemporaryDirectory(prefix="meshrl-bench-tracing-") as d:
        tmp = Path(d)
        servers = {mode: _start_server(tmp, f"server-{mode}", mode == "on") for mode in ("off", "on")}
        configs = {
            "off": T.TelemetryConfig(),
            "on": T.TelemetryConfig(exporter="file", path=str(tmp / "traces" / "client.jsonl")),
        }
        times: dict[str, list[float]] = {"off": [], "on": []}
        try:
            step = 0
            for mode in ("off", "on"):  # warm-up, not counted
                T.setup_telemetry("bench-client", configs[mode])
                run_step(step, servers[mode][1], args.nodes, args.work)
                T.shutdown_telemetry()
            pairs: list[float] = []
            for r in range(args.steps):
                # One step each, order flipped every pair (ABBA), so drift in the machine's load cancels.
                pair: dict[str, float] = {}
                for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    T.setup_telemetry("bench-client", configs[mode])
                    step += 1
                    pair[mode] = run_step(step, servers[mode][1], args.nodes, args.work)
                    T.shutdown_telemetry()
                    times[mode].append(pair[mode])
                pairs.append(pair["on"] / pair["off"])
            costs = {}
            cost_configs = {
                "off": configs["off"],
                "on": T.TelemetryConfig(exporter="file", path=str(tmp / "cost.jsonl")),
            }
            for mode in ("off", "on"):
                T.setup_telemetry("bench-client", cost_configs[mode])
                costs[mode] = span_cost()
                T.shutdown_telemetry()
        finally:
            for proc, channel in servers.values():
                channel.close()
                proc.send_signal(signal.SIGTERM)
            for proc, _ in servers.values():
                proc.wait(timeout=30)
        spans = sum(1 for f in (tmp / "traces").glob("*.jsonl") for _ in f.open())
    med = {m: statistics.median(v) for m, v in times.items()}
    mean = {m: statistics.fmean(v) for m, v in times.items()}
    per_step = spans / (len(times["on"]) + 1)
    print(
        f"{len(times['on'])} steps per mode, {args.nodes} nodes/step, in alternating pairs; "
        f"{per_step:.0f} spans per traced step ({per_step / med['on']:.0f} spans/s of step time)"
    )
    print(f"{'':<22}{'tracing off':>14}{'tracing on (file)':>20}{'ratio on/off':>14}")
    print(
        f"{'median step time':<22}{med['off'] * 1e3:>11.2f} ms{med['on'] * 1e3:>17.2f} ms{med['on'] / med['off']:>14.3f}"
    )
    print(
        f"{'mean step time':<22}{mean['off'] * 1e3:>11.2f} ms{mean['on'] * 1e3:>17.2f} ms{mean['on'] / mean['off']:>14.3f}"
    )
    print(f"{'median of pair ratios':<22}{'':>14}{'':>20}{statistics.median(pairs):>14.3f}")
    print(f"{'one span (in-process)':<22}{costs['off'] * 1e6:>11.2f} us{costs['on'] * 1e6:>17.2f} us")
    print("target: median ratio <= 1.03")


if __name__ == "__main__":
    main()
