"""The rollout's vLLM environment for the tests that run the real engine (`make vllm-env` builds it): its
interpreter, or a skip that names the fix; under `make test` (MESHRL_REQUIRE_VLLM=1) a failure instead, so CI
cannot pass without running them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshrl.rollout.vllm_install import PYTHON_ENV

ROOT = Path(__file__).resolve().parents[1]
GROUP_TOKEN = "vllm-tests-service-token"  # the service token a test server's worker extension holds


def vllm_python() -> str:
    python = os.environ.get(PYTHON_ENV) or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(python).is_file():
        why = f"no vLLM environment at {python}: run `make vllm-env` (or set {PYTHON_ENV})"
        if os.environ.get("MESHRL_REQUIRE_VLLM") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return python
