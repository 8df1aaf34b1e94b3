"""Resident memory of a transformers-engine replica while it sleeps (colocated mode): RSS awake, after
`release_memory()` (KV cache and weights), and after `resume_memory()` plus the in-place weight update that
refills it, with the time each step takes. One run prints one table.

Run: .venv/bin/python bench/rollout/sleep_memory.py [--hidden 768 --layers 12]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from safetensors.torch import load_file

from meshrl.common import weights as W
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.memory import resident_bytes
from meshrl.rollout.transformers_engine import TransformersEngine
from meshrl.rollout.types import DiskUpdate, GenerationRequest, SamplingParams
from meshrl.trainer.model_builder import build_small_model


def mib(n: int) -> str:
    return f"{n / 2**20:8.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(
            build_small_model(
                Path(tmp) / "m",
                hidden_size=args.hidden,
                num_layers=args.layers,
                num_heads=12,
                num_kv_heads=4,
                max_position_embeddings=256,
                seed=1,
            )
        )
        tensors = sorted(load_file(str(model / "model.safetensors")).items())
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        pub = W.write_version(str(Path(tmp) / "w"), 1, tensors, fsync=False)
        del tensors
        engine = TransformersEngine(EngineConfig(model_path=str(model)))
        try:
            greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
            first = engine.generate([GenerationRequest([5, 6, 7, 8], greedy)] * 4)[0].token_ids
            awake = resident_bytes()
            t0 = time.perf_counter()
            engine.release_memory()
            t_release = time.perf_counter() - t0
            asleep = resident_bytes()
            t0 = time.perf_counter()
            engine.resume_memory(["weights"])
            engine.update_weights_from_disk(DiskUpdate(pub.path, 1))
            engine.resume_memory(["kv_cache"])
            t_wake = time.perf_counter() - t0
            again = engine.generate([GenerationRequest([5, 6, 7, 8], greedy)])[0].token_ids
            woken = resident_bytes()
        finally:
            engine.shutdown()
    print(f"model weights (fp32)           {mib(nbytes)}")
    print(f"RSS awake (after generating)   {mib(awake)}")
    print(f"RSS asleep                     {mib(asleep)}   drop {mib(awake - asleep)}  release {t_release:.3f}s")
    print(f"RSS woken + refilled (disk)    {mib(woken)}   wake+update {t_wake:.3f}s")
    print(f"same greedy tokens after wake  {again == first}")


if __name__ == "__main__":
    main()
