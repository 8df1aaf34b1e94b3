"""Ratios and curves of the side-by-side harness: meshrl ÷ TRL held-out gain at equal samples (greedy accuracy,
and the held-out mean partial-credit reward beside it), meshrl ÷ TRL training seconds to reach TRL's final
accuracy, a printed table and one PNG per task; over several seeds, the same ratios of the seeds' mean curves
beside each seed's gain ratio, and the whole pipeline (warm-up, then RL from it) as one more phase. Called by run.py.
"""

from __future__ import annotations

from pathlib import Path

from bench.vs_trl.budget import Curve


def _at_samples(c: Curve, samples: int, values: list[float] | None = None) -> float:
    """Accuracy (or `values`, one per evaluation) of the last evaluation at or before `samples`."""
    values = c.accuracy if values is None else values
    best = values[0]
    for s, a in zip(c.samples, values, strict=True):
        if s <= samples:
            best = a
    return best


def _reward_gain(c: Curve, samples: int) -> float | None:
    return _at_samples(c, samples, c.reward) - c.reward[0] if len(c.reward) == len(c.samples) else None


def _first_reach(c: Curve, target: float) -> float | None:
    for sec, a in zip(c.seconds, c.accuracy, strict=True):
        if a >= target - 1e-9:
            return sec
    return None


def ratios(meshrl: Curve, trl: Curve) -> dict[str, float | None]:
    """gain_ratio: (meshrl final - start) / (TRL final - start) at the samples both reached (None: TRL gained
    nothing); reward_gain_ratio: the same for the held-out mean reward (None: a side recorded no reward, or TRL's
    did not rise); time_ratio: meshrl's seconds to first reach TRL's final accuracy / TRL's (None: meshrl never
    did, or TRL's final accuracy was already its start)."""
    samples = min(meshrl.samples[-1], trl.samples[-1])
    g_m = _at_samples(meshrl, samples) - meshrl.accuracy[0]
    g_t = _at_samples(trl, samples) - trl.accuracy[0]
    target = trl.accuracy[-1]
    t_m, t_t = _first_reach(meshrl, target), _first_reach(trl, target)
    r_m, r_t = _reward_gain(meshrl, samples), _reward_gain(trl, samples)
    return {
        "samples": samples,
        "meshrl_start": meshrl.accuracy[0],
        "trl_start": trl.accuracy[0],
        "meshrl_gain": g_m,
        "trl_gain": g_t,
        "gain_ratio": g_m / g_t if g_t > 0 else None,
        "meshrl_reward_gain": r_m,
        "trl_reward_gain": r_t,
        "reward_gain_ratio": r_m / r_t if r_m is not None and r_t is not None and r_t > 0 else None,
        "trl_final": target,
        "meshrl_seconds": t_m,
        "trl_seconds": t_t,
        "time_ratio": t_m / t_t if t_m is not None and t_t and t_t > 1e-3 else None,  # n/a: TRL never moved
    }


def whole(sft: Curve, rl: Curve) -> Curve:
    """The pipeline from the initial weights: the warm-up's evaluations, then RL's after its first (which
    evaluates the warm-up's final weights again), at samples and seconds counted from the warm-up's start."""
    c = Curve(sft.side, "sft+rl")
    for i, (s, sec, a) in enumerate(zip(sft.samples, sft.seconds, sft.accuracy, strict=True)):
        c.add(s, sec, a, sft.reward[i] if len(sft.reward) == len(sft.samples) else None)
    rewards = len(rl.reward) == len(rl.samples) and len(c.reward) == len(c.samples)
    for i in range(1, len(rl.samples)):
        c.add(
            sft.samples[-1] + rl.samples[i],
            sft.seconds[-1] + rl.seconds[i],
            rl.accuracy[i],
            rl.reward[i] if rewards else None,
        )
    return c


def mean_curve(curves: list[Curve]) -> Curve:
    """The pointwise mean of several seeds' curves of one side and phase (the evaluations they share)."""
    n = min(len(c.samples) for c in curves)
    avg = lambda rows: [sum(r[i] for r in rows) / len(rows) for i in range(n)]  # noqa: E731
    m = Curve(
        curves[0].side,
        curves[0].phase,
        samples=list(curves[0].samples[:n]),
        seconds=avg([c.seconds for c in curves]),
        accuracy=avg([c.accuracy for c in curves]),
    )
    if all(len(c.reward) >= n for c in curves):
        m.reward = avg([c.reward for c in curves])
    return m


def pooled(pairs: list[tuple[Curve, Curve]]) -> dict[str, float | None]:
    """`ratios` of the seeds' mean curves, with each seed's own gain ratio (`seed_gain_ratios`) beside them."""
    r = ratios(mean_curve([m for m, _ in pairs]), mean_curve([t for _, t in pairs]))
    r["seed_gain_ratios"] = [ratios(m, t)["gain_ratio"] for m, t in pairs]
    return r


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "  n/a" if v is None else format(v, spec)


def _reward_cell(r: dict) -> str:
    """`+m/+t = ratio` of the held-out mean reward's gains ('n/a' when a side recorded none)."""
    m, t = r.get("meshrl_reward_gain"), r.get("trl_reward_gain")
    if m is None or t is None:
        return "n/a"
    return f"{m:+.3f}/{t:+.3f}={_fmt(r.get('reward_gain_ratio')).strip()}"


def table(rows: list[tuple[str, str, dict]]) -> str:
    head = (
        f"{'task':<9} {'phase':<10} {'samples':>7} {'start m/t':>11} {'gain meshrl':>11} {'gain TRL':>8} "
        f"{'gain m/t':>8} {'rew gain m/t':>18} {'TRL final':>9} {'s to it m':>9} {'s to it t':>9} "
        f"{'time m/t':>8}"
    )
    lines = [head, "-" * len(head)]
    for task, phase, r in rows:
        lines.append(
            f"{task:<9} {phase:<10} {r['samples']:>7} {r['meshrl_start']:>5.3f}/{r['trl_start']:<5.3f} "
            f"{r['meshrl_gain']:>+11.3f} {r['trl_gain']:>+8.3f} {_fmt(r['gain_ratio']):>8} {_reward_cell(r):>18} "
            f"{r['trl_final']:>9.3f} "
            f"{_fmt(r['meshrl_seconds'], '.1f'):>9} {_fmt(r['trl_seconds'], '.1f'):>9} {_fmt(r['time_ratio']):>8}"
        )
    return "\n".join(lines)


def seeds_table(rows: list[tuple[str, str, dict]]) -> str:
    """The mean-curve ratios per task and phase, each seed's gain ratio after them."""
    lines = [table(rows), "", "gain m/t of each seed:"]
    for task, phase, r in rows:
        lines.append(f"  {task:<9} {phase:<10} " + " ".join(_fmt(g) for g in r["seed_gain_ratios"]))
    return "\n".join(lines)


def plot(task: str, pairs: list[tuple[str, Curve, Curve]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(pairs), figsize=(4.2 * len(pairs), 6.4), squeeze=False)
    for col, (phase, m, t) in enumerate(pairs):
        for row, (xs, label) in enumerate((("samples", "training samples"), ("seconds", "training seconds"))):
            ax = axes[row][col]
            for c, style in ((m, "o-"), (t, "s--")):
                ax.plot(getattr(c, xs), c.accuracy, style, ms=3, label=c.side)
            ax.set_xlabel(label)
            ax.set_ylabel("held-out accuracy")
            ax.set_title(f"{task}: {phase}")
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
