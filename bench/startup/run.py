"""Start-up of a job's services, side by side in one run: the data buffer, then the trainer and a replica
started `sequential` (one `ProcessLauncher.start` each, as the launcher did before) or `together` (one
batch, as `JobServices.open` starts them now); the seconds until every one serves, and until `stop_all`
has stopped them. Rounds alternate the two modes, so machine load falls on both alike.

Also the import of the tensor codec's `ml_dtypes` in a fresh interpreter, which every service pays.

Run: `.venv/bin/python bench/startup/run.py [--rounds 2]` (from the repository root; a tiny model is
built in a temporary folder). Each round costs two service start-ups, about a minute on 2 busy cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from meshrl.scheduler.launch.launcher import ProcessLauncher, ServiceSpec

MODES = ("sequential", "together")


def _specs(root: Path, model: str, buffer: str) -> list[ServiceSpec]:
    with_buffer = ["--set", f"databuffer_address={buffer}", "--set", f"paths.roots={json.dumps([str(root)])}"]
    return [
        ServiceSpec("trainer", "trainer", with_buffer),
        ServiceSpec("rollout", "rollout-0", [*with_buffer, "--set", f"engine.model_path={model}"]),
    ]


def one_round(root: Path, model: str, mode: str) -> tuple[float, float]:
    """(seconds until the trainer and the replica serve, seconds for stop_all) of one start in `mode`."""
    launcher = ProcessLauncher(root / "logs", start_timeout=600)
    try:
        buffer = launcher.start([ServiceSpec("databuffer", "databuffer", ["--set", f"redis.embedded.data_dir={root}"])])
        specs = _specs(root, model, buffer["databuffer"])
        started = time.monotonic()
        if mode == "together":
            launcher.start(specs)
        else:
            for spec in specs:
                launcher.start([spec])
        start_s = time.monotonic() - started
    finally:
        stopping = time.monotonic()
        launcher.stop_all()
    return start_s, time.monotonic() - stopping


def import_seconds(module: str) -> float:
    code = f"import time, numpy; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from importlib.metadata import version

    from meshrl.trainer.model_builder import build_small_model

    print(f"ml_dtypes {version('ml_dtypes')}: import {import_seconds('ml_dtypes'):.2f}s (after numpy)")
    with tempfile.TemporaryDirectory(prefix="meshrl-bench-startup-") as tmp:
        root = Path(tmp)
        model = str(build_small_model(root / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1))
        results: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
        for i in range(args.rounds):
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                run_root = root / f"{mode}-{i}"
                results[mode].append(one_round(run_root, model, mode))
                print(f"round {i} {mode:<10} start {results[mode][-1][0]:6.1f}s  stop {results[mode][-1][1]:5.1f}s")
    med = {m: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)) for m, rs in results.items()}
    print("\nmode        start (median)  stop (median)")
    for m in MODES:
        print(f"{m:<11} {med[m][0]:13.1f}s {med[m][1]:13.1f}s")
    seq, tog = med["sequential"], med["together"]
    print(f"together / sequential: start {tog[0] / seq[0]:.2f}x, stop {tog[1] / max(seq[1], 1e-9):.2f}x")


if __name__ == "__main__":
    main()
