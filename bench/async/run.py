"""Synchronous vs. asynchronous training on an example, side by side in one run (issues 16 and 43).

Runs an example (`--example`: countdown, the default, or sorting, whose responses are 3-4x longer; its config
and workflow) once per mode, one after the other in this process through the real services: `sync`,
`one_step_off`, `async` with max_staleness 1 and 2 (same seeds); `--modes` may also name `async_eta0`, the
asynchronous machinery (producer, stream, in-train pi_old, TIS/MIS) on samples of the current weights: what the
machinery costs apart from staleness. `--disaggregated` gives the trainer and the rollout replica a core each
(services.cpu_placement shares 1:1, docs/modes.md). For each mode it prints wall-clock from the start of RL (the
step-0 evaluation's end) to the first held-out evaluation at or above the accuracy `sync` ends at, its ratio to
sync's, the mean trainer- and rollout-idle fractions per step (1 - busy/trainer, 1 - busy/rollout; a step whose
wall holds an evaluation is left out), the consumed samples' staleness, the final held-out accuracy, the load
average when the mode started and ended, and how busy the host's CPUs were over the RL phase ("host busy",
host_cpu.py). Target (issues 16, 43): the best asynchronous mode reaches sync's final accuracy in <= 0.7x sync's
time and ends no lower than sync - 0.05.

With `--seeds 0,1,2` every mode runs once per seed (job.seed and data.shuffle_seed; the model and data stay
the same) and each seed's asynchronous runs are compared with that seed's sync run; the summary gives each
mode's mean and min..max over the seeds, and the verdict is taken on the means. Per mode it also prints where
a step's time goes: median seconds per step in the rollout, the trainer (log-probs + train), the weight
publication, and the consumer's wait for samples; and what the off-policy correction faced: per step means of
the rollout-vs-pi_old log-prob gap of tokens 0, 1 and 2 versions old (the drift per version), the importance
weight, the masked and clipped token fractions, the ratio pi / pi_old and the grad norm (sync, whose pi_old is
the rollout's own, reports only the last three).

Run (from the repository root; the example's model and data are built under runs/ on first use):
`.venv/bin/python bench/async/run.py [--example countdown|sorting] [--disaggregated] [--steps N] [--eval-every 5]
[--prompts N] [--seeds 0] [--modes ...] [--tis-cap C] [--mis-cap M] [--trainer-threads N] [--use-ray]
[--workflow W] [--set KEY=VALUE ...] [--async-set KEY=VALUE ...] [--out FILE] [--sync-from FILE]`; --set applies
to every mode, --async-set to the asynchronous ones only, and --sync-from FILE takes sync's runs from an earlier
--out file. Each mode costs about what `meshrl run` of the example costs (minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the example's modules (data generator, reward)

from host_cpu import HostCpu  # noqa: E402

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb  # noqa: E402
from meshrl.scheduler.jobs import JobManager  # noqa: E402
from meshrl.scheduler.step.pacing.modes import node_kinds  # noqa: E402

EXAMPLES = ("countdown", "sorting")
MODES = {
    "sync": {"mode": "sync"},
    "one_step_off": {"mode": "one_step_off"},
    "async_eta1": {"mode": "async", "max_staleness": 1},
    "async_eta2": {"mode": "async", "max_staleness": 2},
    "async_eta0": {"mode": "async", "max_staleness": 0},
}
DEFAULT_MODES = ("sync", "one_step_off", "async_eta1", "async_eta2")  # async_eta0 only when named (docstring)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--example", choices=EXAMPLES, default="countdown", help="which example under examples/")
    p.add_argument(
        "--disaggregated",
        action="store_true",
        help="services.cpu_placement trainer_share 1, rollout_share 1: each side on cores of its own",
    )
    p.add_argument("--steps", type=int, default=0, help="RL steps per mode (0: the example's)")
    p.add_argument("--eval-every", type=int, default=5, help="held-out evaluation every K steps")
    p.add_argument("--prompts", type=int, default=0, help="prompts per step (0: the example's)")
    p.add_argument("--warmup-steps", type=int, default=-1, help="supervised warm-up steps (-1: the example's)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, from {list(MODES)}")
    p.add_argument(
        "--tis-cap",
        type=float,
        default=0.0,
        help="algorithm.loss.tis_cap for every mode (0: the mode default: off in sync, 2 in the async modes)",
    )
    p.add_argument(
        "--mis-cap",
        type=float,
        default=0.0,
        help="algorithm.loss.mis_cap for every mode (0: the mode default: off in sync, 4 in the async modes)",
    )
    p.add_argument("--seeds", default="0", help="comma-separated job seeds; every mode runs once per seed")
    p.add_argument(
        "--trainer-threads",
        type=int,
        default=0,
        help="trainer torch_threads for every mode (0: the mode's default, see training.split_threads)",
    )
    p.add_argument(
        "--no-split-threads",
        action="store_true",
        help="training.split_threads false for every mode (the trainer uses every core in the async modes too)",
    )
    p.add_argument("--use-ray", action="store_true", help="services as Ray actors (default: plain processes)")
    p.add_argument("--workflow", default="", help="the step's DAG (default: the example's workflow.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a job-config override, every mode")
    p.add_argument(
        "--async-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a job-config override for the asynchronous modes only (sync keeps the example's recipe)",
    )
    p.add_argument("--out", default="", help="write the figures as JSON here too")
    p.add_argument(
        "--sync-from",
        default="",
        metavar="JSON",
        help="take each seed's sync run from an earlier --out file of the same settings instead of running it again "
        "(sync gives the same curve run after run on one host; its times are that run's)",
    )
    return p.parse_args(argv)


def job_yaml(a: argparse.Namespace, mode: str, run_root: Path, seed: int = 0) -> str:
    cfg = yaml.safe_load((example_dir(a) / "config.yaml").read_text())
    cfg["job"].update(name=f"bench-{mode.replace('_', '-')}-s{seed}", run_root=str(run_root), seed=seed)
    if a.steps:
        cfg["job"]["steps"] = a.steps
    cfg["data"]["shuffle_seed"] = seed
    for section, field in (("model", "path"), ("data", "train"), ("data", "eval")):
        cfg[section][field] = str(ROOT / cfg[section][field])  # shared by every mode: built once
    cfg["eval"]["every"] = a.eval_every
    cfg["checkpoint"] = {"every": 0}
    cfg["services"] = {**cfg.get("services", {}), "use_ray": a.use_ray}
    if a.disaggregated:
        cfg["services"]["cpu_placement"] = {"trainer_share": 1, "rollout_share": 1}
    cfg["training"] = dict(MODES[mode])
    if a.no_split_threads:
        cfg["training"]["split_threads"] = False
    if a.trainer_threads:
        cfg["trainer"].setdefault("service_overrides", []).append(f"torch_threads={a.trainer_threads}")
    if a.prompts:
        cfg["data"]["prompts_per_step"] = a.prompts
    for name, value in (("tis_cap", a.tis_cap), ("mis_cap", a.mis_cap)):
        if value:
            cfg["algorithm"].setdefault("loss", {})[name] = value
    if a.warmup_steps >= 0:
        cfg["warmup"]["steps"] = a.warmup_steps
    return yaml.safe_dump(cfg)


def example_dir(a: argparse.Namespace) -> Path:
    return ROOT / "examples" / a.example


def overrides_for(a: argparse.Namespace, mode: str) -> list[str]:
    """The job-config overrides of `mode`: --set for every mode, --async-set for the asynchronous ones."""
    return list(a.set) + (list(a.async_set) if MODES[mode]["mode"] != "sync" else [])


def run_mode(a: argparse.Namespace, mode: str, run_root: Path, seed: int = 0) -> dict:
    jobs = JobManager()
    workflow = Path(a.workflow or example_dir(a) / "workflow.yaml").read_text()
    record = jobs.create(workflow, job_yaml(a, mode, run_root, seed), overrides_for(a, mode))
    load_start = os.getloadavg()[0]
    with HostCpu() as cpu:
        jobs.run(record)
    load_end = os.getloadavg()[0]
    if record.state != spb.JOB_STATE_SUCCEEDED:
        raise SystemExit(f"{mode}: the job ended {spb.JobState.Name(record.state)}: {record.error}")
    evals = []  # (step, accuracy, wall time of the evaluation's end)
    for e in record.events.read(0, 0)[0]:
        if e.WhichOneof("body") == "metrics" and "eval/accuracy" in e.metrics.metrics:
            evals.append((e.metrics.step, e.metrics.metrics["eval/accuracy"], e.time))
    steps = [json.loads(line) for line in record.runner.run.metrics_file.read_text().splitlines()]
    cfg = record.runner.cfg
    lags = [k for m in steps for k in m if k.startswith("async/staleness_") and k[-1].isdigit()]
    staleness = {k.rsplit("_", 1)[1]: sum(m.get(k, 0.0) for m in steps) for k in sorted(set(lags))}
    return {
        "evals": evals,
        "final": evals[-1][1],
        "rl_seconds": evals[-1][2] - evals[0][2],
        "host_busy": cpu.busy(evals[0][2], evals[-1][2]),
        "trainer_idle": statistics.mean(m["async/trainer_idle_fraction"] for m in between_evals(steps)),
        "rollout_idle": statistics.mean(m["async/rollout_idle_fraction"] for m in between_evals(steps)),
        "load": (load_start, load_end),
        "step_seconds": statistics.median(m["time/step"] for m in steps),
        "staleness": staleness,
        "dropped": sum(m.get("async/dropped_groups", 0.0) for m in steps),
        "stream_max": max((m.get("async/stream_groups_max", 0.0) for m in steps), default=0.0),
        "stream_bound": float(cfg.training.stream_groups or (cfg.training.staleness + 1) * cfg.data.prompts_per_step),
        "regenerated": sum(m.get("async/regenerated_groups", 0.0) for m in steps),
        "phases": phase_seconds(steps, record.runner.workflow.nodes),
        "off_policy": off_policy_figures(steps),
        "rewards": [m.get("reward/mean") for m in steps],  # the training reward per step (producer's, async)
    }


def between_evals(steps: list[dict]) -> list[dict]:
    """The steps whose wall holds no evaluation (the one after an evaluating step counts it in its idle time)."""
    kept = [m for prev, m in zip([{}, *steps], steps) if "eval/accuracy" not in prev]
    return kept or steps


# per-step metrics of the off-policy correction: (printed name, metric key)
OFF_POLICY = (
    ("gap lag0", "async/logprob_gap_lag0"),
    ("gap lag1", "async/logprob_gap_lag1"),
    ("gap lag2", "async/logprob_gap_lag2"),
    ("tis w", "actor/tis_weight"),
    ("masked", "actor/is_masked_fraction"),
    ("clipped", "actor/clip_fraction"),
    ("ratio", "actor/ratio"),
    ("grad norm", "actor/grad_norm"),
)


def off_policy_figures(steps: list[dict]) -> dict[str, float | None]:
    """Mean over the steps that report it of each OFF_POLICY metric: the mean |rollout - pi_old| log-prob gap
    of tokens one or two versions old (the drift per version the correction faces), the mean importance weight,
    the masked and clipped token fractions, the mean ratio pi / pi_old and the grad norm (None: never reported)."""
    out: dict[str, float | None] = {}
    for name, key in OFF_POLICY:
        values = [m[key] for m in steps if key in m]
        out[name] = statistics.mean(values) if values else None
    return out


def phase_seconds(steps: list[dict], nodes: list) -> dict[str, float]:
    """Median seconds per step spent in the rollout nodes, the trainer's nodes (log-probs and train), the
    weight publication, and (asynchronous modes) the consumer's wait for its samples."""
    rollout, trainer = node_kinds(nodes)

    def median(keys: tuple[str, ...]) -> float:
        return statistics.median(sum(m.get(k, 0.0) for k in keys) for m in steps)

    return {
        "rollout": median(tuple(f"time/{i}" for i in rollout)),
        "trainer": median(tuple(f"time/{i}" for i in trainer)),
        "publish": median(("weights/seconds",)),
        "wait": median(("async/wait_seconds",)),
        "reward": median(("time/reward",)),
        "handoff": median(("async/handoff_seconds",)),
        "produce": median(("async/produce_seconds",)),
    }


def seconds_to(result: dict, target: float) -> float | None:
    start = result["evals"][0][2]
    for _step, accuracy, when in result["evals"][1:]:
        if accuracy >= target - 1e-9:
            return when - start
    return None


def seeds_of(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        seeds = []
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise SystemExit(f"--seeds {text!r}: give distinct non-negative integers, e.g. 0,1,2")
    return seeds


def print_table(a: argparse.Namespace, results: dict[str, dict], seed: int) -> dict[str, dict]:
    """One seed's table; returns per mode its ratio to sync's time, final and final - sync's final."""
    target = results["sync"]["final"]
    base = seconds_to(results["sync"], target)
    print(
        f"\nseed {seed}: {a.example}, {a.steps or 'the config'} RL steps per mode, evaluation every "
        f"{a.eval_every}{', disaggregated (a core each)' if a.disaggregated else ''}; "
        f"target: sync's final accuracy {target:.3f}"
    )
    head = f"{'mode':<14}{'to target s':>12}{'x sync':>8}{'RL s':>8}{'step s':>8}{'host busy':>11}{'trainer idle':>14}"
    print(
        head + f"{'rollout idle':>14}{'final acc':>11}{'load':>12}  staleness (groups by lag), dropped, "
        "stream max / bound"
    )
    summary = {}
    for mode, r in results.items():
        t = seconds_to(r, target)
        ratio = t / base if t is not None and base else None
        print(
            f"{mode:<14}{(f'{t:.1f}' if t is not None else 'never'):>12}{(f'{ratio:.2f}' if ratio else '-'):>8}"
            f"{r['rl_seconds']:>8.1f}{r['step_seconds']:>8.2f}{busy_text(r['host_busy']):>11}"
            f"{r['trainer_idle']:>14.2f}{r['rollout_idle']:>14.2f}"
            f"{r['final']:>11.3f}{load_text(r.get('load')):>12}  {r['staleness'] or '-'}, {r['dropped']:.0f}, {r['stream_max']:.0f} / "
            f"{r['stream_bound']:.0f}"
        )
        summary[mode] = {
            "ratio": ratio,
            "final": r["final"],
            "delta": r["final"] - target,
            "step_ratio": r["step_seconds"] / results["sync"]["step_seconds"],
        }
    names = ("rollout", "reward", "trainer", "publish", "wait", "handoff", "produce")
    print(f"{'mode':<14}{'median s per step:':>20}" + "".join(f"{n:>9}" for n in names))
    for mode, r in results.items():
        print(f"{mode:<34}" + "".join(f"{r['phases'][n]:>9.2f}" for n in names))
    print(f"{'mode':<14}{'mean per step:':>20}" + "".join(f"{n:>10}" for n, _ in OFF_POLICY))
    for mode, r in results.items():
        print(f"{mode:<34}" + "".join(f"{figure(r['off_policy'][n]):>10}" for n, _ in OFF_POLICY))
    print("held-out accuracy by step:")
    for mode, r in results.items():
        print(f"{mode:<14}" + " ".join(f"{step}:{accuracy:.3f}" for step, accuracy, _ in r["evals"]))
    return summary


def figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def load_text(load: list[float] | None) -> str:
    """The 1-minute load average when the mode started and when it ended."""
    return "-" if not load else f"{load[0]:.1f}-{load[1]:.1f}"


def busy_text(busy: float | None) -> str:
    return "-" if busy is None else f"{busy:.2f}"


def spread(values: list[float | None], fmt: str = "{:.2f}") -> str:
    """mean [min..max] of the values; 'never' counts as missing (shown as how many)."""
    got = [v for v in values if v is not None]
    missing = len(values) - len(got)
    if not got:
        return "never"
    text = fmt.format(statistics.mean(got))
    if len(values) > 1:
        text += f" [{fmt.format(min(got))}..{fmt.format(max(got))}]"
    return text + (f" ({missing} never)" if missing else "")


def print_summary(per_seed: dict[int, dict[str, dict]]) -> None:
    """Each mode over the seeds, and the verdict on the means (issue 16's target)."""
    seeds = list(per_seed)
    modes = list(per_seed[seeds[0]])
    print(f"\nover seeds {seeds}: mean [min..max]")
    print(f"{'mode':<14}{'x sync to target':>26}{'step x sync':>22}{'final':>24}{'final - sync':>26}")
    verdict = []
    for mode in modes:
        rows = [per_seed[s][mode] for s in seeds]
        ratios = [r["ratio"] for r in rows]
        deltas = [r["delta"] for r in rows]
        print(
            f"{mode:<14}{spread(ratios):>26}{spread([r['step_ratio'] for r in rows]):>22}"
            f"{spread([r['final'] for r in rows], '{:.3f}'):>24}{spread(deltas, '{:+.3f}'):>26}"
        )
        if mode != "sync":
            # a seed on which the mode never reached sync's final counts as missing the time target
            met = all(r is not None for r in ratios) and statistics.mean(ratios) <= 0.7
            met = met and statistics.mean(deltas) >= -0.05
            verdict.append((mode, met))
    best = [m for m, ok in verdict if ok]
    print(
        f"target (mean x sync <= 0.70 with every seed reaching sync's final, mean final >= sync - 0.05): "
        f"{'met by ' + ', '.join(best) if best else 'missed'}"
    )


def earlier_sync(path: str, seeds: list[int]) -> dict[int, dict]:
    """Each seed's sync result from an earlier --out file; refuses a file that lacks one of `seeds`."""
    saved = json.loads(Path(path).read_text())
    missing = [s for s in seeds if "sync" not in saved.get(str(s), {})]
    if missing:
        raise SystemExit(f"--sync-from {path}: no sync run of seed(s) {missing}; run them (drop --sync-from)")
    return {s: saved[str(s)]["sync"] for s in seeds}


def main(argv=None) -> int:
    a = parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or "sync" not in modes:
        raise SystemExit(f"--modes: {unknown or 'sync is missing'}; choose from {list(MODES)} (sync included)")
    seeds = seeds_of(a.seeds)
    earlier = earlier_sync(a.sync_from, seeds) if a.sync_from else {}
    results: dict[int, dict[str, dict]] = {}
    per_seed: dict[int, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="mr-async-") as tmp:
        for seed in seeds:
            results[seed] = {}
            for mode in ["sync", *[m for m in modes if m != "sync"]]:
                if mode == "sync" and seed in earlier:
                    print(f"sync, seed {seed}: from {a.sync_from}", flush=True)
                    results[seed][mode] = earlier[seed]
                    continue
                print(f"running {mode}, seed {seed} ...", flush=True)
                results[seed][mode] = run_mode(a, mode, Path(tmp), seed)
            per_seed[seed] = print_table(a, results[seed], seed)
    print_summary(per_seed)
    if a.out:
        Path(a.out).write_text(json.dumps({str(s): r for s, r in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
