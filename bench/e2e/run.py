"""Step time through the services vs. the same GRPO step in one process, side by side in one run (issue 8).

Service side: a real `meshrl` job (JobManager, the built-in `grpo` workflow) whose data buffer (+ embedded
Redis), trainer and rollout replica are separate processes (`services.use_ray: false`: plain child
processes; --use-ray: Ray actors), publishing weights by disk with checksum verification (the job
defaults). In-process side: bench/e2e/inprocess.py with the same model, prompts (same sampler seed, so the
same prompts each step), n, generation length, loss, optimizer, torch threads, and disk publication with
the same verification (--weights memory copies tensors instead). The two modes alternate step by step in
this process: each service step is followed (odd steps) or preceded (even steps) by one in-process step
while the job waits, so both see the same machine load. The first --warmup steps are dropped; medians of
the rest are printed per node with service / in-process ratios (target for the step: <= 1.2 at 64
samples per step, <= 1.05 at 1,024), CPU
seconds of the whole process tree per step (less sensitive to a busy machine than wall time), start-up
costs, and where the services' extra time goes (node windows from the job's events matched with the
spans the services export to their trace files), and per step what the data plane moved (bench/e2e/dataplane.py):
RPCs, bytes read from the buffer / bytes the nodes' declared inputs need, and the scheduler's own bulk bytes.

Trainer threads default to 1 on both sides (the trainer service gets MESHRL_TORCH_THREADS): with one
torch thread per core (the services' default, --trainer-threads 0) a busy 2-core machine makes OpenMP
barriers, not the services, dominate the trainer phases (10-50x swings between identical calls).

Run: `.venv/bin/python bench/e2e/run.py [--steps 5] [--prompts 32] [--n 8] [--max-tokens 12] [--use-ray]`
(64 samples per step: --prompts 8 --n 8; 1,024: --prompts 128 --n 8).
Needs nothing outside this machine (the job embeds its own Redis). Takes about a minute on 2 idle cores,
most of it starting the services.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent / "common"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from dataplane import StepProbe, print_traffic, step_traffic  # noqa: E402
from dataplane import read_spans as read_span_dicts  # noqa: E402
from inprocess import PHASES, InProcessLoop, LoopSettings  # noqa: E402
from tiny_task import add_task_arguments, make_task  # noqa: E402

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb  # noqa: E402
from meshrl.scheduler.jobs import JobManager  # noqa: E402
from meshrl.scheduler.workflow import builtin_workflow_text  # noqa: E402

WEIGHT_PARTS = ("weights/export", "weights/load", "weights/verify")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5, help="measured steps (after the warm-up)")
    p.add_argument("--warmup", type=int, default=1, help="steps dropped before measuring")
    # Shapes of the default example's recipe (bench/e2e/recipe_probe.py: Recipe): 32 prompts x 8, 12 tokens.
    add_task_arguments(p, prompts=32, n=8, max_tokens=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--use-ray", action="store_true", help="place the services as Ray actors (default: processes)")
    p.add_argument("--weights", choices=("disk", "memory"), default="disk", help="in-process weight publication")
    p.add_argument("--telemetry", default="file", choices=("file", "none"), help="the job's trace exporter")
    p.add_argument(
        "--trainer-threads",
        type=int,
        default=1,
        help="torch threads of the trainer on both sides (0: the services' default, one per core)",
    )
    p.add_argument("--workdir", default=None, help="keep the model, data and run folder here (default: a temp dir)")
    p.add_argument("--json-out", default=None, help="also write every measurement here")
    return p.parse_args(argv)


def job_yaml(a: argparse.Namespace, task: dict[str, str], run_root: Path) -> str:
    cfg = {
        "job": {"name": "bench-e2e", "steps": a.warmup + a.steps, "run_root": str(run_root)},
        "model": {"path": task["model"]},
        "data": {"train": task["train"], "prompts_per_step": a.prompts},
        "rollout": {"replicas": 1, "n": a.n, "max_tokens": a.max_tokens},
        "eval": {"every": 0},
        "checkpoint": {"every": 0},
        "services": {"use_ray": a.use_ray},
        "trainer": {"optimizer": {"lr": a.lr}},
        "telemetry": {"exporter": a.telemetry},
    }
    return yaml.safe_dump(cfg)


def cpu_table() -> dict[int, tuple[int, float]]:
    """{pid: (parent pid, user + system CPU seconds)} of every process, from /proc."""
    table: dict[int, tuple[int, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return table


def subtree_cpu(table: dict[int, tuple[int, float]], root: int | None) -> float:
    """CPU seconds of `root` and all its descendants (a service and e.g. its Redis, or the whole run)."""
    mine, frontier = set(), [root] if root else []
    while frontier:
        pid = frontier.pop()
        mine.add(pid)
        frontier += [p for p, (ppid, _) in table.items() if ppid == pid and p not in mine]
    return sum(table[p][1] for p in mine if p in table)


def cpu_by_process(svc) -> dict[str, float]:
    """CPU seconds so far: the whole run's process tree, this process (the scheduler) and each service."""
    table = cpu_table()
    out = {"all": subtree_cpu(table, os.getpid()), "scheduler": table[os.getpid()][1]}
    for name in svc.addresses if svc is not None else []:
        out[name] = subtree_cpu(table, svc.launcher.pid(name))
    return out


def median(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def service_glue(m: dict) -> float:
    """Step time not inside any node's critical path: executor, weight bookkeeping, buffer clean-up."""
    branches = max(m["time/reward"] + m["time/advantage"], m["time/old_logprob"], m["time/ref_logprob"])
    path = m["time/data_load"] + m["time/rollout"] + branches + m["time/actor_train"] + m["weights/seconds"]
    return m["time/step"] - path


def startup_seconds(record) -> dict[str, float]:
    """From the job's events: job start -> services up -> first step's first node."""
    running = up = first = None
    for e in record.events.read(0, 0)[0]:
        kind = e.WhichOneof("body")
        if kind == "state" and e.state.state == spb.JOB_STATE_RUNNING and running is None:
            running = e.time
        elif kind == "log" and e.log.startswith("services up") and up is None:
            up = e.time
        elif kind == "node" and e.node.step == 1 and first is None:
            first = e.time
    if None in (running, up, first):
        return {}
    return {"services_up": up - running, "models_and_first_publish": first - up}


# -- where the services' extra time goes: node windows (job events) matched with the services' spans --------
SERVER = {
    "rollout": ("rollout-0", ("Rollout/GenerateBatch",)),
    "old+ref_logprob": ("trainer", ("Trainer/ComputeLogProbs",)),
    "actor_train": ("trainer", ("Trainer/TrainStep",)),
    "weights": (
        None,
        (
            "Trainer/PublishWeights",
            "Trainer/GetWeightChecksums",
            "Rollout/UpdateWeightsFromDisk",
            "Rollout/GetStatus",
            "Rollout/GetWeightChecksums",
        ),
    ),
}


def read_spans(traces: Path) -> list[tuple[str, str, str, float, float]]:
    """(instance, name, kind, start s, end s) of every span the services exported to their trace files."""
    spans = []
    for path in sorted(traces.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            d = json.loads(line)
            spans.append((path.stem, d["name"], d["kind"], d["start_ns"] / 1e9, d["end_ns"] / 1e9))
    return spans


def node_windows(record) -> dict[int, dict[str, tuple[float, float]]]:
    """{step: {node or "step"/"weights": (start, end)}} from the job's events (wall clock, like the spans)."""
    win: dict[int, dict[str, list[float]]] = {}
    for e in record.events.read(0, 0)[0]:
        kind = e.WhichOneof("body")
        if kind == "node":
            w = win.setdefault(e.node.step, {})
            w.setdefault("step", [e.time, e.time])
            if e.node.state == spb.NODE_STATE_RUNNING:
                w[e.node.node_id] = [e.time, e.time]
            elif e.node.state == spb.NODE_STATE_COMPLETED:
                w[e.node.node_id][1] = e.time
        elif kind == "metrics" and e.metrics.step in win:
            w = win[e.metrics.step]
            w["step"][1] = e.time
            w["weights"] = [w["actor_train"][1], e.time]
    for w in win.values():
        w["old+ref_logprob"] = [
            min(w["old_logprob"][0], w["ref_logprob"][0]),
            max(w["old_logprob"][1], w["ref_logprob"][1]),
        ]
    return {step: {k: tuple(v) for k, v in w.items()} for step, w in win.items()}


def covered(spans) -> float:
    """Seconds covered by the union of the spans' intervals (concurrent calls are not counted twice)."""
    total, end = 0.0, float("-inf")
    for s in sorted(spans, key=lambda s: s[3]):
        if s[4] > end:
            total += s[4] - max(s[3], end)
            end = s[4]
    return total


def attribute(record, spans, steps: list[int]) -> dict[str, dict[str, float]]:
    """Per group, medians over `steps` of: wall (scheduler), handler (service span), buffer (its data-buffer calls)."""
    windows = node_windows(record)
    rows: dict[str, dict[str, list[float]]] = {}

    def inside(w, s):
        return w[0] - 1e-3 <= s[3] and s[4] <= w[1] + 1e-3

    for step in steps:
        w = windows[step]
        for group, (instance, names) in SERVER.items():
            mine = [s for s in spans if inside(w[group], s) and (instance is None or s[0] == instance)]
            handler = covered([s for s in mine if s[2] == "SERVER" and s[1].split(".")[-1] in names])
            buffer = covered([s for s in mine if s[2] == "CLIENT" and "DataBuffer/" in s[1]])
            r = rows.setdefault(group, {})
            for k, v in (("wall", w[group][1] - w[group][0]), ("handler", handler), ("buffer", buffer)):
                r.setdefault(k, []).append(v)
        sched = [w[n] for n in ("data_load", "reward", "advantage")]
        buf = [s for s in spans if s[0] == "databuffer" and s[2] == "SERVER" and any(inside(x, s) for x in sched)]
        r = rows.setdefault("data_load+reward+advantage", {})
        r.setdefault("wall", []).append(sum(x[1] - x[0] for x in sched))
        r.setdefault("buffer", []).append(covered(buf))
        in_step = [s for s in spans if s[0] == "databuffer" and s[2] == "SERVER" and inside(w["step"], s)]
        r = rows.setdefault("whole step: data-buffer server", {})
        r.setdefault("calls", []).append(len(in_step))
        r.setdefault("buffer", []).append(covered(in_step))
    return {g: {k: statistics.median(v) for k, v in r.items()} for g, r in rows.items()}


def print_attribution(att: dict[str, dict[str, float]], inp: list[dict]) -> None:
    compute = {
        "rollout": median(inp, "rollout"),
        "old+ref_logprob": median(inp, "old_logprob") + median(inp, "ref_logprob"),
        "actor_train": median(inp, "actor_train"),
        "weights": median(inp, "weights"),
        "data_load+reward+advantage": median(inp, "data_load") + median(inp, "reward") + median(inp, "advantage"),
    }
    w = 11
    print("\nwhere the service time goes (medians, seconds; handler = the service's server span, buffer = its")
    print("data-buffer round trips, rpc gap = wall - handler: gRPC, scheduler threads, waiting for the trainer lock)")
    print(f"{'group':<30}{'wall':>{w}}{'handler':>{w}}{'buffer':>{w}}{'rpc gap':>{w}}{'in-proc':>{w}}")
    for group, r in att.items():
        if "wall" not in r:
            continue
        h = r.get("handler", float("nan"))
        gap = r["wall"] - h if "handler" in r else float("nan")
        print(f"{group:<30}{r['wall']:>{w}.4f}{h:>{w}.4f}{r['buffer']:>{w}.4f}{gap:>{w}.4f}{compute[group]:>{w}.4f}")
    b = att.get("whole step: data-buffer server")
    if b:
        print(f"data buffer per step: {b['calls']:.0f} calls, {b['buffer']:.4f}s inside the data-buffer server")


def print_cpu(svc: list[dict], inp: list[dict]) -> None:
    """CPU and wall seconds per step: each service process vs. the in-process phases it stands for."""
    groups = [  # (process, service nodes, in-process phases)
        ("rollout-0", ["time/rollout"], ["rollout"]),
        (
            "trainer",
            ["time/old_logprob", "time/ref_logprob", "time/actor_train", "weights/seconds"],
            ["old_logprob", "ref_logprob", "actor_train", "weights"],
        ),
        ("scheduler", ["time/data_load", "time/reward", "time/advantage"], ["data_load", "reward", "advantage"]),
        ("databuffer", [], []),
    ]
    print("\nper process (medians, s/step): CPU and wall of its nodes, vs. the in-process phases it stands for")
    print(f"  {'process':<12}{'CPU':>8}{'wall':>8}    {'in-process phases':<40}{'CPU':>8}{'wall':>8}")
    for proc, nodes, phases in groups:
        s_wall = sum(median(svc, k) for k in nodes)
        i_cpu, i_wall = sum(median(inp, f"cpu/{p}") for p in phases), sum(median(inp, p) for p in phases)
        print(
            f"  {proc:<12}{median(svc, f'cpu/{proc}'):8.3f}{s_wall:8.3f}    {'+'.join(phases) or '-':<40}"
            f"{i_cpu:8.3f}{i_wall:8.3f}"
        )
    print("  (trainer wall adds old and ref although they overlap; the scheduler runs reward/advantage meanwhile)")


def print_table(svc: list[dict], inp: list[dict]) -> None:
    w = 13
    print(f"\n{'node':<22}{'services s':>{w}}{'in-process s':>{w}}{'ratio':>{w}}")
    for phase in PHASES:
        skey = "weights/seconds" if phase == "weights" else f"time/{phase}"
        s, i = median(svc, skey), median(inp, phase)
        print(f"{phase:<22}{s:>{w}.4f}{i:>{w}.4f}{s / i if i else float('nan'):>{w}.2f}")
    for part in WEIGHT_PARTS:
        print(f"{'  ' + part:<22}{'':>{w}}{median(inp, part):>{w}.4f}")
    s, i = median(svc, "time/step"), median(inp, "step")
    print(f"{'STEP (median)':<22}{s:>{w}.4f}{i:>{w}.4f}{s / i:>{w}.2f}   target <= 1.2 at 64 samples, <= 1.05 at 1,024")
    print(f"{'  sum of nodes':<22}{median(svc, '_sum'):>{w}.4f}{median(inp, '_sum'):>{w}.4f}")
    print(f"{'  critical-path glue':<22}{median(svc, '_glue'):>{w}.4f}")
    s, i = median(svc, "cpu"), median(inp, "cpu")
    print(
        f"{'CPU s / step':<22}{s:>{w}.4f}{i:>{w}.4f}{s / i if i else float('nan'):>{w}.2f}   all processes of the run"
    )
    print(f"{'tokens / step':<22}{median(svc, 'rollout/generated_tokens'):>{w}.0f}{median(inp, 'tokens'):>{w}.0f}")


def main(argv=None) -> dict:
    a = parse_args(argv)
    tmp = None if a.workdir else tempfile.TemporaryDirectory(prefix="meshrl-bench-e2e-")
    root = Path(a.workdir or tmp.name)
    root.mkdir(parents=True, exist_ok=True)
    try:
        return measure(a, root)
    finally:
        if tmp is not None:
            tmp.cleanup()


def measure(a: argparse.Namespace, root: Path) -> dict:
    load_start = os.getloadavg()
    task = make_task(root, a.hidden, a.layers)
    settings = LoopSettings(
        model=task["model"],
        train=task["train"],
        weights_root=str(root / "inprocess-weights"),
        prompts_per_step=a.prompts,
        n=a.n,
        max_tokens=a.max_tokens,
        lr=a.lr,
        weights=a.weights,
    )
    if a.trainer_threads > 0:
        settings.trainer_threads = a.trainer_threads
        os.environ["MESHRL_TORCH_THREADS"] = str(a.trainer_threads)  # the trainer service's torch_threads field
    loop = InProcessLoop(settings)
    print(
        f"in-process set-up {loop.setup_seconds:.1f}s; engine threads {loop.engine_threads}, "
        f"trainer threads {settings.trainer_threads}"
    )

    inp_steps: list[dict] = []
    jobs = JobManager()
    record = jobs.create(builtin_workflow_text("grpo"), job_yaml(a, task, root / "runs"), [])
    runner = record.runner
    service_step = runner._train_step

    svc_cpu: dict[int, dict[str, float]] = {}
    probe = StepProbe(list(runner.workflow.nodes))

    def inprocess_step() -> None:
        cpu = cpu_by_process(None)["all"]
        metrics = loop.step()
        metrics["cpu"] = cpu_by_process(None)["all"] - cpu
        inp_steps.append(metrics)

    def alternating_step(svc, executor, publisher, *rest):
        """One service step and one in-process step, in alternating order; the job waits meanwhile.
        CPU seconds of the whole process tree are taken around each, so both include the idle side's."""
        if not getattr(svc.buffer, "_probed", False):
            probe.install(svc.buffer, runner.job_id)
            svc.buffer._probed = True
        if runner.step % 2 == 0:
            inprocess_step()
        cpu = cpu_by_process(svc)
        metrics = service_step(svc, executor, publisher, *rest)
        svc_cpu[runner.step] = {k: v - cpu[k] for k, v in cpu_by_process(svc).items()}
        if runner.step % 2 == 1:
            inprocess_step()
        return metrics

    runner._train_step = alternating_step
    started = time.perf_counter()
    try:
        jobs.run(record)
    finally:
        loop.close()
    job_seconds = time.perf_counter() - started
    if record.state != spb.JOB_STATE_SUCCEEDED:
        raise SystemExit(f"the service job failed:\n{record.error}")
    load_end = os.getloadavg()

    svc_steps = runner.run.read_jsonl(runner.run.metrics_file)
    for m in svc_steps:
        m["time/step"] -= probe.seconds.get(m["step"], 0.0)  # the bench's own reads of the step's batches
        m.update({"cpu" if k == "all" else f"cpu/{k}": v for k, v in svc_cpu.get(m["step"], {}).items()})
        m["_sum"] = sum(m["weights/seconds" if p == "weights" else f"time/{p}"] for p in PHASES)
        m["_glue"] = service_glue(m)
    for m in inp_steps:
        m["_sum"] = sum(m[p] for p in PHASES)
    svc, inp = svc_steps[a.warmup :], inp_steps[a.warmup :]

    mode = "Ray actors (use_ray: true)" if a.use_ray else "plain processes (use_ray: false)"
    print(
        f"\nGRPO step, {a.prompts} prompts x n={a.n}, max {a.max_tokens} tokens, model hidden {a.hidden} x "
        f"{a.layers} layers; services as {mode}; in-process weights by {a.weights}; medians of {len(svc)} steps "
        f"after {a.warmup} warm-up; modes alternate step by step"
    )
    print_table(svc, inp)
    start = startup_seconds(record)
    print(
        "\nstart-up, not in step time (s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in start.items())
        + f"; in-process set-up {loop.setup_seconds:.2f}; whole job with both modes {job_seconds:.1f}"
    )
    print_cpu(svc, inp)
    spans = [s for s in read_spans(runner.run.traces) if not probe.covers(s[3])]  # not the bench's own reads
    if spans:
        print_attribution(attribute(record, spans, [m["step"] for m in svc]), inp)
    windows = {step: w["step"] for step, w in node_windows(record).items()}
    traffic = step_traffic(read_span_dicts(runner.run.traces), windows, probe)
    dataplane = print_traffic(traffic, [m["step"] for m in svc])
    stale = [m["step"] for m in svc_steps if m.get("weights/stale_replicas")]
    if stale:
        print(f"\nWARNING: the replica refused the weights at steps {stale}; the service 'weights' row is not valid")
    print(
        f"\nload average (1, 5, 15 min) at start {tuple(round(x, 2) for x in load_start)}, "
        f"at end {tuple(round(x, 2) for x in load_end)}; {os.cpu_count()} cores"
    )
    out = {
        "args": vars(a),
        "service_steps": svc_steps,
        "inprocess_steps": inp_steps,
        "startup": start,
        "inprocess_setup": loop.setup_seconds,
        "load_start": load_start,
        "load_end": load_end,
        "dataplane": dataplane,
        "traffic": traffic,
    }
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1, default=float))
    return out


if __name__ == "__main__":
    main()
