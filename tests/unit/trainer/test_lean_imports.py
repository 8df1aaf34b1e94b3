"""`meshrl.trainer.lean_imports`: megatron-core imported inside `lean()` leaves wandb and torch._dynamo out of the
process, a blocked package is importable again after the block, and a function `torch.compile` decorated inside
it is compiled on its first call and computes what the plain function does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from meshrl.trainer.lean_imports import without

FRESH = """
import sys
from meshrl.trainer.lean_imports import lean
with lean():
    import megatron.core
    import megatron.core.inference.contexts.dynamic_context
print("wandb" in sys.modules, "torch._dynamo" in sys.modules)
"""

COMPILE = """
import sys, torch
from meshrl.trainer.lean_imports import compile_on_first_call
real = torch.compile
with compile_on_first_call():
    f = torch.compile(lambda x: x * 2 + 1, backend="eager")
    g = torch.compile(backend="eager")(lambda x: x - 1)
print(torch.compile is real, "torch._dynamo" in sys.modules)
x = torch.arange(4.0)
print(f(x).tolist(), g(x).tolist(), "torch._dynamo" in sys.modules)
"""


def _run(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return out.stdout.split("\n")


def test_megatron_imported_lean_leaves_wandb_and_dynamo_out():
    pytest.importorskip("wandb")  # installed here: without the block megatron-core would import it
    assert _run(FRESH)[0] == "False False"


def test_compile_on_first_call_defers_then_compiles_the_same_function():
    lines = _run(COMPILE)
    assert lines[0] == "True False"  # torch.compile restored; nothing compiled, dynamo not imported yet
    assert lines[1] == "[1.0, 3.0, 5.0, 7.0] [-1.0, 0.0, 1.0, 2.0] True"


def test_without_blocks_inside_and_restores_after(tmp_path, monkeypatch):
    (tmp_path / "meshrl_lean_probe.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with without("meshrl_lean_probe"):
        with pytest.raises(ImportError):
            import meshrl_lean_probe  # noqa: F401
    import meshrl_lean_probe

    assert meshrl_lean_probe.VALUE == 7
    monkeypatch.delitem(sys.modules, "meshrl_lean_probe")
