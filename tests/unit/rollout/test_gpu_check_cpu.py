"""scripts/gpu_check.sh --cpu: the device check's CPU twins run in CI (engine generation, colocated publication
through shared memory verified by checksums, the engines' weight-group wire over gloo between two processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_gpu_check_cpu_mode_passes_and_prints_its_figures():
    env = {**os.environ, "PYTHON": sys.executable}
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu"], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("PASS")]
    assert any("generates on cpu" in ln for ln in lines)
    assert any("shared memory" in ln and "GB/s" in ln for ln in lines)
    assert any("engine weight group over gloo" in ln for ln in lines)


def test_gpu_check_fails_loudly_without_cuda():
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1 and "FAIL no CUDA device visible" in run.stderr
