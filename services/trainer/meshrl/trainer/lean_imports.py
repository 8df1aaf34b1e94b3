"""Keeps what the trainer does not use out of its start-up imports: megatron-core pulls in wandb (its inference
context logs to it when importable) and, by decorating its fused kernels with `torch.compile` at import time,
all of torch._dynamo / torch._inductor (sympy, networkx, ...), though a kernel is only compiled on its first call.
Measured with `python -X importtime -c "import meshrl.trainer.runtime"`: those two were the largest imports
under megatron-core. Used by `meshrl.trainer.__main__` and `meshrl.trainer.worker` around their first import of
megatron-core; in-process users (tests, benches) import it plainly and pay the full import.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["compile_on_first_call", "lean", "without"]

OPTIONAL = ("wandb",)  # optional packages megatron-core imports when present; meshrl never logs through them


@contextlib.contextmanager
def without(*names: str) -> Iterator[None]:
    """Inside the block `import name` raises ImportError (as if it were not installed) for each name not yet
    imported; after it, a later `import name` works again. Code imported inside keeps its fallback."""
    blocked = [name for name in names if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment] - the import system's "not importable" marker
    try:
        yield
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def without_wandb() -> contextlib.AbstractContextManager[None]:
    return without(*OPTIONAL)


class _Deferred:
    """`torch.compile(fn, **options)` made on the first call of the function, not when it is decorated."""

    def __init__(self, compile_: Callable[..., Any], fn: Callable[..., Any], options: dict[str, Any]) -> None:
        self._compile, self._fn, self._options = compile_, fn, options
        self._compiled: Callable[..., Any] | None = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._compiled is None:
            self._compiled = self._compile(self._fn, **self._options)
        return self._compiled(*args, **kwargs)


@contextlib.contextmanager
def compile_on_first_call() -> Iterator[None]:
    """Inside the block `torch.compile` defers its work (and its import of torch._dynamo) to the first call of
    what it decorates; code that kept a reference to it (megatron-core's `jit_fuser`) keeps the deferring one,
    which compiles exactly as `torch.compile` would, one call later. Functions only: a module is compiled now."""
    import torch

    real = torch.compile

    def deferred(model: Any = None, **options: Any) -> Any:
        if model is None:  # used as @torch.compile(mode=...)
            return lambda fn: deferred(fn, **options)
        if isinstance(model, torch.nn.Module) or not callable(model):
            return real(model, **options)
        return _Deferred(real, model, options)

    torch.compile = deferred  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = real


@contextlib.contextmanager
def lean() -> Iterator[None]:
    """Both of the above: wrap the trainer's first import of megatron-core in it."""
    with without_wandb(), compile_on_first_call():
        yield
