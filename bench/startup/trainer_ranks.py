"""Trainer start and stop, 1 rank and TP=2, this checkout against another checkout (`--base`, e.g. a worktree of
main), side by side in one run: the seconds from `python -m meshrl.trainer` until it prints that it serves, and
from SIGTERM until every rank has exited. Rounds alternate the two trees, so machine load falls on both alike.

The base tree runs with this venv and PYTHONPATH pointing at its sources (they come first on sys.path, before
the venv's editable installs of this checkout). No model is loaded: this is the service's own start and stop.

Run: `git worktree add --detach ../meshrl-base main` once, then
`.venv/bin/python bench/startup/trainer_ranks.py --base ../meshrl-base [--rounds 2]` from the repository root.
Each round costs four trainer starts (about a minute on 2 busy cores).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCES = ("libs/common", "services/databuffer", "services/rollout", "services/scheduler", "services/trainer")
LAYOUTS = {"1 rank": [], "TP=2": ["--set", "parallel.tensor_parallel=2", "--set", "torch_threads=1"]}


def one_start(tree: Path | None, extra: list[str], log: Path, timeout: float = 300.0) -> tuple[float, float]:
    """(seconds until the trainer serves, seconds from SIGTERM until it exited) of one trainer in `tree`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(tree / s) for s in SOURCES)
    cmd = [sys.executable, "-m", "meshrl.trainer", "--set", "server.port=0", *extra]
    with log.open("w") as err:  # stderr to a file: a pipe nobody reads could fill and stall the ranks
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, start_new_session=True)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if "serving on" in line:
                    break
            else:
                raise RuntimeError(f"the trainer exited with {proc.wait()} before serving; see {log}")
            start_s = time.monotonic() - started
            stopping = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.stdout.read()
            proc.wait(timeout)
            _wait_group_gone(proc.pid, timeout)
            return start_s, time.monotonic() - stopping
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def _wait_group_gone(pgid: int, timeout: float) -> None:
    """Until no process of the trainer's session (rank 0 and the ranks it spawned) is left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise RuntimeError(f"trainer ranks of process group {pgid} still running after {timeout:.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="another checkout of meshrl (e.g. of main)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "this": None}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {(t, lay): [] for t in trees for lay in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="meshrl-bench-trainer-ranks-") as tmp:
        for i in range(args.rounds):
            for layout, extra in LAYOUTS.items():
                for name in trees if i % 2 == 0 else list(trees)[::-1]:
                    got = one_start(trees[name], extra, Path(tmp) / f"{name}-{layout.replace(' ', '')}-{i}.log")
                    results[(name, layout)].append(got)
                    print(f"round {i} {layout:<6} {name:<4}  start {got[0]:5.2f}s  stop {got[1]:5.2f}s", flush=True)
    print("\nlayout  start base -> this (ratio)     stop base -> this (ratio)   [medians]")
    for layout in LAYOUTS:
        b, t = results[("base", layout)], results[("this", layout)]
        bs, ts = statistics.median(r[0] for r in b), statistics.median(r[0] for r in t)
        bx, tx = statistics.median(r[1] for r in b), statistics.median(r[1] for r in t)
        print(f"{layout:<7} {bs:5.2f}s -> {ts:5.2f}s ({ts / bs:.2f}x)      {bx:5.2f}s -> {tx:5.2f}s ({tx / bx:.2f}x)")


if __name__ == "__main__":
    main()
