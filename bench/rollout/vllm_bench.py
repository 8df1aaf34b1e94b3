"""vLLM against the transformers engine, and meshrl's vLLM adapter against vLLM's own offline engine,
measured side by side in one run on the same prompts and model (issue 38's figures).

1. Generated tokens/s: vLLM's offline `LLM.generate` (a subprocess in the vLLM environment), meshrl's
   vLLM adapter (a launched vLLM server driven over HTTP, what a rollout replica runs: a batch goes as one call
   to meshrl's batch route), the same adapter streaming each request on its own (`/inference/v1/generate`,
   what a server without meshrl's endpoint plugin gets), and the transformers engine in this process. Ratios:
   adapter / offline (the adapter's overhead, target >= 0.9) and vLLM adapter / transformers engine. Every
   request generates exactly --max-tokens tokens (ignore_eos). Two batch shapes: --prompts distinct prompts,
   and RL's shape (--prompts / --samples prompts, --samples each). Offline and adapter runs alternate (the
   offline engine stays loaded in its own process), so the load of a shared host falls on both alike; ratios
   are of each adapter run to the offline run beside it.
2. A whole RL step (--rl-steps > 0): the default example for --rl-steps steps on each engine
   (examples/countdown with examples/countdown/vllm.yaml's model, heads of 32, for both), median step time.

Run: .venv/bin/python bench/rollout/vllm_bench.py [--prompts 256] [--samples 8] [--max-tokens 32] [--repeats 3]
     [--rl-steps 6] [--no-transformers]
Needs the vLLM environment (`make vllm-env`; its interpreter from MESHRL_VLLM_PYTHON or .venv-vllm).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from meshrl.rollout.config import EngineConfig
from meshrl.rollout.transformers_engine import TransformersEngine
from meshrl.rollout.types import GenerationRequest, SamplingParams
from meshrl.rollout.vllm_engine import VLLMEngine
from meshrl.rollout.vllm_install import PYTHON_ENV
from meshrl.trainer.model_builder import build_small_model

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def vllm_python() -> str:
    python = os.environ.get(PYTHON_ENV) or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(python).is_file():
        sys.exit(f"no vLLM environment at {python}: run `make vllm-env` (or set {PYTHON_ENV})")
    return python


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 250, size=int(rng.integers(8, 24))).tolist() for _ in range(count)]


def engine_rate(engine, batch: list[list[int]], max_tokens: int, repeats: int, warm: bool = True) -> float:
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
    if warm:
        engine.generate([GenerationRequest(p, sampling) for p in batch[:4]], timeout=600)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = engine.generate([GenerationRequest(p, sampling) for p in batch], timeout=600)
        rates.append(sum(len(r.token_ids) for r in out) / (time.perf_counter() - start))
    return statistics.median(rates)


class Offline:
    """vllm_offline.py kept running in the vLLM environment: one `LLM.generate` of a shape per call."""

    def __init__(self, python: str, model: Path, shapes: dict[str, list[list[int]]], max_tokens: int, work: Path):
        prompt_file, self.log = work / "prompts.json", work / "offline.log"
        prompt_file.write_text(json.dumps(shapes))
        cmd = [python, str(HERE / "vllm_offline.py"), str(model), str(prompt_file), str(max_tokens)]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        self._line("READY")

    def _line(self, prefix: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :]
        sys.exit(f"vLLM's offline engine failed:\n{self.log.read_text(errors='replace')[-3000:]}")

    def rate(self, shape: str) -> float:
        self.proc.stdin.write(shape + "\n")
        self.proc.stdin.flush()
        result = json.loads(self._line("RESULT "))
        return result["tokens"] / result["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def adapter_rate(adapter: VLLMEngine, batch: list[list[int]], max_tokens: int, batch_route: bool) -> float:
    """One batch through the adapter: one call to meshrl's batch route, or (False) a stream per request."""
    route = adapter.batch_path()
    adapter._batch_path = route if batch_route else None  # as on a server without meshrl's endpoint plugin
    try:
        return engine_rate(adapter, batch, max_tokens, repeats=1, warm=False)
    finally:
        adapter._batch_path = route


def paired(rates: dict[str, list[float]], name: str) -> str:
    """Median tokens/s of `name`, and its ratio to the offline run beside it (median and range over runs)."""
    ratios = [a / b for a, b in zip(rates[name], rates["offline"], strict=True)]
    return f"{statistics.median(rates[name]):9.0f}   / offline = {statistics.median(ratios):.2f} (runs {min(ratios):.2f}-{max(ratios):.2f})"


def rl_step_seconds(engine: str, steps: int, work: Path, python: str) -> float:
    """Median step time of the default example on `engine` (the first step, which warms up, left out)."""
    configs = ["--config", "examples/countdown/config.yaml", "--config", "examples/countdown/vllm.yaml"]
    sets = ["--set", f"rollout.engine={engine}", "--set", f"job.steps={steps}", "--set", "eval.every=0"]
    sets += ["--set", f"job.run_root={work / engine}"]
    run = ["run", "examples/countdown/workflow.yaml", *configs, *sets, "--no-progress"]
    cmd = [sys.executable, "-m", "meshrl.scheduler.cli", *run]
    env = {**os.environ, PYTHON_ENV: python}  # the replica launches its vLLM server with this interpreter
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=1800)
    metrics = next((work / engine).glob("*/metrics.jsonl")).read_text().splitlines()
    times = [json.loads(line)["time/step"] for line in metrics if "time/step" in line]
    return statistics.median(times[1:] or times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=256, help="requests per batch")
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt of the grouped batch (RL's shape)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rl-steps", type=int, default=6, help="0 = skip the whole-step comparison")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers engine's figures")
    args = ap.parse_args()
    python = vllm_python()
    groups = max(1, args.prompts // args.samples)
    shapes = {
        f"{args.prompts} distinct prompts": prompts(args.prompts),
        f"{groups} prompts x {args.samples} samples": [p for p in prompts(groups) for _ in range(args.samples)],
    }
    runs: dict[str, dict[str, list[float]]] = {name: {"offline": [], "adapter": [], "alone": []} for name in shapes}
    local: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="meshrl-bench-vllm-") as tmp:
        work = Path(tmp)
        model = build_small_model(work / "model", hidden_size=64, num_heads=2, num_kv_heads=1, seed=0)
        offline = Offline(python, model, shapes, args.max_tokens, work)
        section = {"python": python, "extra_args": {"dtype": "float32"}, "log_file": str(work / "vllm.log")}
        config = EngineConfig(kind="vllm", model_path=str(model), max_batch_size=args.prompts, vllm=section)
        adapter = VLLMEngine(config)
        try:
            for batch in shapes.values():
                for batch_route in (True, False):
                    adapter_rate(adapter, batch[:4], args.max_tokens, batch_route)  # warm
            for _ in range(args.repeats):  # alternating, so a shared host's load falls on all alike
                for name, batch in shapes.items():
                    runs[name]["offline"].append(offline.rate(name))
                    runs[name]["adapter"].append(adapter_rate(adapter, batch, args.max_tokens, True))
                    runs[name]["alone"].append(adapter_rate(adapter, batch, args.max_tokens, False))
        finally:
            adapter.shutdown()
            offline.close()
        if not args.no_transformers:
            hf = TransformersEngine(EngineConfig(model_path=str(model), max_batch_size=args.prompts))
            try:
                for name, batch in shapes.items():
                    local[name] = engine_rate(hf, batch, args.max_tokens, args.repeats)
            finally:
                hf.shutdown()
        for name, rates in runs.items():
            served = statistics.median(rates["adapter"])
            print(f"{name} x {args.max_tokens} tokens, {args.repeats} runs of each, alternating; tokens/s (median):")
            print(f"  vLLM offline LLM.generate   {statistics.median(rates['offline']):9.0f}")
            print(f"  meshrl vLLM adapter         {paired(rates, 'adapter')}")
            print(f"    a stream per request      {paired(rates, 'alone')}")
            if name in local:
                print(
                    f"  transformers engine         {local[name]:9.0f}   vLLM adapter / transformers = {served / local[name]:.2f}"
                )
        if args.rl_steps:
            runs = ROOT / "runs" / f"bench-vllm-{os.getpid()}"  # under the repository's run root
            seconds = {e: rl_step_seconds(e, args.rl_steps, runs, python) for e in ("transformers", "vllm")}
            print(f"RL step of the default example (128 prompts x 8 samples), median of {args.rl_steps - 1} steps:")
            print(
                f"  transformers {seconds['transformers']:.2f} s   vllm {seconds['vllm']:.2f} s   "
                f"vllm / transformers = {seconds['vllm'] / seconds['transformers']:.2f}"
            )


if __name__ == "__main__":
    main()
