"""Which Hugging Face tensors vLLM loads as one unit, and holding received tensors until each unit is whole.

vLLM 0.32 reloads weights layer by layer (`reload_weights(..., is_checkpoint_format=True)`): within one call a
module whose parameters arrive only in part is processed with the rest left unloaded. So every call must carry
whole modules: q/k/v (weights and biases) of one `qkv_proj`, gate/up of one `gate_up_proj`, and every other
module's own tensors. Buckets from the trainer may split a module, so `PendingModules` holds tensors until
their module is complete. Used by `vllm_worker` (inside vLLM's workers); torch-free apart from the tensors it
holds, and tested without vLLM.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

# HF projection -> the vLLM module it is fused into
FUSED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}


def module_of(name: str) -> str:
    """The vLLM module an HF tensor loads into: `model.layers.0.self_attn.q_proj.bias` -> `...self_attn.qkv_proj`."""
    base = name.rpartition(".")[0]
    head, _, last = base.rpartition(".")
    fused = FUSED.get(last)
    return f"{head}.{fused}" if fused else base


def modules_of(names: Iterable[str]) -> dict[str, set[str]]:
    """{module: the HF tensor names it needs}."""
    out: dict[str, set[str]] = defaultdict(set)
    for name in names:
        out[module_of(name)].add(name)
    return dict(out)


class PendingModules:
    """Tensors received but not loaded yet, released module by module as each becomes whole.

    `expected` is {module: HF names} of the served model (from its folder); a tensor of a module the model
    does not have is refused before anything is held.
    """

    def __init__(self, expected: dict[str, set[str]]) -> None:
        self.expected = expected
        self._held: dict[str, dict[str, Any]] = defaultdict(dict)

    def add(self, named: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Holds `named`; returns every (name, tensor) of the modules this made whole, in arrival order."""
        ready: list[tuple[str, Any]] = []
        for name, tensor in named:
            module = module_of(name)
            if name not in self.expected.get(module, ()):
                raise KeyError(f"the served model has no tensor named {name!r}")
            held = self._held[module]
            held[name] = tensor
            if set(held) == self.expected[module]:
                ready += held.items()
                del self._held[module]
        return ready

    def incomplete(self) -> dict[str, list[str]]:
        """{module: its names still missing} of every module held in part."""
        return {m: sorted(self.expected[m] - set(h)) for m, h in self._held.items()}

    def clear(self) -> None:
        self._held.clear()
