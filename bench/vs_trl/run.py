"""Side-by-side harness: meshrl (`meshrl run`, through the services) and TRL (SFTTrainer + GRPOTrainer) on the
same model folder, data and budget, phase by phase, on the harness's own tasks (bench/vs_trl/tasks.py):

  sft        supervised warm-up from the same initial weights (meshrl's `warmup` phase vs SFTTrainer)
  rl-own     GRPO from each side's own warm start
  rl-common  GRPO from one common warm start (TRL's SFT weights) on both sides
  sft+rl     the whole pipeline from the initial weights: sft, then rl-own (no run of its own)

Prints, per task and phase, meshrl ÷ TRL held-out gain at equal samples and meshrl ÷ TRL training seconds to
reach TRL's final accuracy, and writes curves (accuracy vs samples and vs seconds) as PNG per task.

  make setup-trl
  .venv/bin/python bench/vs_trl/run.py                      # the quick budget (minutes per task)
  .venv/bin/python bench/vs_trl/run.py --full               # the issue's budget: 2,000 RL steps of 64 samples
  .venv/bin/python bench/vs_trl/run.py --seeds 0,1,2        # three seeds per task, ratios of the mean curves
  .venv/bin/python bench/vs_trl/run.py --tasks reverse --rl-steps 40 --meshrl-set warmup.handover=keep
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.vs_trl.budget import Budget, Curve  # noqa: E402
from bench.vs_trl.compare import mean_curve, plot, pooled, ratios, seeds_table, table, whole  # noqa: E402
from bench.vs_trl.meshrl_side import run_meshrl  # noqa: E402
from bench.vs_trl.tasks import TASKS, write_task_data  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["reverse", "sort_len", "add"], choices=list(TASKS))
    p.add_argument("--full", action="store_true", help="the issue's budget (Budget.full)")
    for name in ("sft_steps", "rl_steps", "sft_batch", "prompts_per_step", "n", "n_eval", "rl_eval_every", "seed"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int)
    p.add_argument("--seeds", default="", help="comma-separated seeds, each a full run of every task (default: --seed)")
    p.add_argument("--sft-lr", type=float)
    p.add_argument("--rl-lr", type=float)
    p.add_argument("--temperature", type=float, help="rollout sampling temperature (both sides)")
    p.add_argument("--trl-threads", type=int)
    p.add_argument(
        "--reuse-trl",
        action="store_true",
        help="reuse TRL's curves and weights of an earlier run with the same budget (to compare meshrl settings)",
    )
    p.add_argument(
        "--no-common",
        action="store_true",
        help="skip meshrl's rl-common run (it has no warm-up, so warm-up settings do not change it)",
    )
    p.add_argument("--meshrl-set", action="append", default=[], metavar="KEY=VALUE", help="extra meshrl override")
    p.add_argument("--report", metavar="RESULTS_JSON", help="only reprint the table and redraw the PNGs of a run")
    p.add_argument("--out", default="runs/vs_trl", help="work folder (models, data, run folders, results.json)")
    p.add_argument("--png-dir", default=str(Path(__file__).resolve().parent), help="where curves_<task>.png go")
    return p.parse_args(argv)


def budget_of(args: argparse.Namespace) -> Budget:
    b = Budget.full() if args.full else Budget()
    for name in Budget.__dataclass_fields__:
        if getattr(args, name, None) is not None:
            setattr(b, name, getattr(args, name))
    return b


def trl_phases(name: str, b: Budget, work: Path, model: Path, data: Path, reuse: bool) -> tuple[Curve, Curve, Path]:
    """TRL's SFT and GRPO-from-its-SFT curves and SFT weights (from `trl.json` when reusing a same-budget run)."""
    saved = work / "trl.json"
    if reuse and saved.exists() and json.loads(saved.read_text())["budget"] == b.to_dict():
        d = json.loads(saved.read_text())
        print(f"[{name}] TRL curves reused from {saved}", flush=True)
        return Curve.from_dict(d["sft"]), Curve.from_dict(d["rl"]), Path(d["weights"])
    import torch

    from bench.vs_trl.trl_side import trl_grpo, trl_sft  # optional dependency: imported only when run

    torch.set_num_threads(b.trl_threads)
    print(f"[{name}] TRL SFT", flush=True)
    sft, weights = trl_sft(TASKS[name], b, model, data, work)
    print(f"[{name}] TRL GRPO from its SFT", flush=True)
    rl = trl_grpo(TASKS[name], b, weights, data, work, "rl-own")
    saved.write_text(
        json.dumps({"budget": b.to_dict(), "sft": sft.to_dict(), "rl": rl.to_dict(), "weights": str(weights)})
    )
    return sft, rl, weights


def run_task(
    name: str, b: Budget, out: Path, sets: list[str], reuse: bool, common: bool = True
) -> list[tuple[str, Curve, Curve]]:
    task, work = TASKS[name], out / (name if b.seed == 0 else f"{name}-seed{b.seed}")
    b = b.for_task(task.sft_steps, task.rl_lr)
    print(
        f"[{name}] warm-up {b.sft_steps} steps x {b.sft_batch}, RL {b.rl_steps} steps x {b.rl_samples_per_step}",
        flush=True,
    )
    data = work / "data"
    write_task_data(task, data, b.seed, b.n_train, b.n_eval)
    model = b.build_model(work / "model")
    trl_sft_curve, trl_rl, trl_weights = trl_phases(name, b, work, model, data, reuse)
    print(f"[{name}] meshrl warm-up + GRPO", flush=True)
    m_sft, m_rl_own = run_meshrl(task, b, model, data, work, "rl-own", True, sets)
    m_sft.samples.insert(0, 0), m_sft.seconds.insert(0, 0.0), m_sft.accuracy.insert(0, trl_sft_curve.accuracy[0])
    if m_sft.reward and trl_sft_curve.reward:  # both start from the same initial weights
        m_sft.reward.insert(0, trl_sft_curve.reward[0])
    pairs = [("sft", m_sft, trl_sft_curve), ("rl-own", m_rl_own, trl_rl)]
    pairs.append(("sft+rl", whole(m_sft, m_rl_own), whole(trl_sft_curve, trl_rl)))
    if common:
        print(f"[{name}] meshrl GRPO from TRL's SFT weights", flush=True)
        _, m_rl_common = run_meshrl(task, b, trl_weights, data, work, "rl-common", False, sets)
        pairs.append(("rl-common", m_rl_common, trl_rl))
    return pairs


def seeds_of(args: argparse.Namespace, b: Budget) -> list[int]:
    return [int(x) for x in args.seeds.split(",") if x.strip()] or [b.seed]


def _key(name: str, seed: int, phase: str, several: bool) -> str:
    return f"{name}@{seed}/{phase}" if several else f"{name}/{phase}"


def report(results: dict, png_dir: Path) -> str:
    """The table (ratios recomputed; over several seeds, of the mean curves) and the PNGs of a results.json."""
    by_task: dict[str, dict[str, list[tuple[Curve, Curve]]]] = {}
    for key, value in results.items():
        if "/" in key:
            label, phase = key.split("/")
            pair = (Curve.from_dict(value["meshrl"]), Curve.from_dict(value["trl"]))
            by_task.setdefault(label.split("@")[0], {}).setdefault(phase, []).append(pair)
    png_dir.mkdir(parents=True, exist_ok=True)
    several = any("@" in key for key in results)
    rows = []
    for name, phases in by_task.items():
        for phase, pairs in phases.items():
            rows.append((name, phase, pooled(pairs) if several else ratios(*pairs[0])))
        means = [(p, mean_curve([m for m, _ in ps]), mean_curve([t for _, t in ps])) for p, ps in phases.items()]
        plot(name, [x for x in means if x[0] != "sft+rl"], png_dir / f"curves_{name}.png")
    return seeds_table(rows) if several else table(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.report:
        print(report(json.loads(Path(args.report).read_text()), Path(args.png_dir)))
        return 0
    b, out = budget_of(args), Path(args.out).resolve()
    seeds = seeds_of(args, b)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.png_dir).mkdir(parents=True, exist_ok=True)
    print(f"budget: {b.to_dict()}\nseeds: {seeds}\nmeshrl overrides: {args.meshrl_set or 'none'}", flush=True)
    started = time.monotonic()
    results = {"budget": b.to_dict(), "seeds": seeds, "meshrl_set": args.meshrl_set}
    for name in args.tasks:
        for seed in seeds:
            pairs = run_task(name, replace(b, seed=seed), out, args.meshrl_set, args.reuse_trl, not args.no_common)
            for phase, m, t in pairs:
                key = _key(name, seed, phase, len(seeds) > 1)
                results[key] = {"ratios": ratios(m, t), "meshrl": m.to_dict(), "trl": t.to_dict()}
            (out / "results.json").write_text(json.dumps(results, indent=1))
    print("\nheld-out greedy accuracy, meshrl (m) vs TRL (t); seconds are training time, evaluation excluded")
    print("(rl-common: both sides start from TRL's SFT weights, so TRL's curve is its rl-own run;")
    print(" sft+rl: the warm-up and then rl-own, from the initial weights)\n")
    print(report(results, Path(args.png_dir)))
    print(f"\nharness wall time {time.monotonic() - started:.0f} s; results in {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
