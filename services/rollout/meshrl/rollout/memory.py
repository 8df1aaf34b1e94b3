"""Releasing and re-taking an in-process engine's memory while it sleeps (colocated mode: trainer and
replica time-share a device): the tag vocabulary of the engines' own calls (SGLang's
release/resume_memory_occupation, vLLM's sleep/wake_up), freeing parameters' memory (the Parameter
objects stay, so a weight update refills them), and the process's resident memory.

Used by `TransformersEngine.release_memory` / `resume_memory`; `change_memory` by the rollout servicer
(ReleaseMemory / ResumeMemory, which the scheduler's colocated step loop calls); `resident_bytes` by the benches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from meshrl.common.errors import InvalidArgument

TAGS = ("weights", "kv_cache")


def check_tags(tags: Sequence[str]) -> tuple[str, ...]:
    """The tags asked for (empty = all), each one known."""
    unknown = [t for t in tags if t not in TAGS]
    if unknown:
        raise InvalidArgument(f"memory tags {unknown} are not among {list(TAGS)}")
    return tuple(tags) or TAGS


def resident_bytes() -> int:
    """This process's resident set size (Linux /proc; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _trim_heap() -> None:
    """Hands freed heap pages back to the OS (glibc keeps them otherwise), then empties CUDA's cache."""
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc:
        try:
            ctypes.CDLL(libc).malloc_trim(0)
        except (OSError, AttributeError):
            pass  # not glibc
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_parameters(params: Iterable[torch.nn.Parameter]) -> list[tuple[torch.nn.Parameter, torch.Size]]:
    """Frees each parameter's memory (its data becomes an empty tensor; the Parameter objects stay, so
    modules and tied weights keep pointing at them); returns what `restore_parameters` needs."""
    released = []
    for p in dict.fromkeys(params):  # a tied parameter once
        if p.numel():
            released.append((p, p.shape))
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
    _trim_heap()
    return released


def restore_parameters(released: list[tuple[torch.nn.Parameter, torch.Size]]) -> int:
    """Re-allocates released parameters at their shapes (contents undefined until weights arrive); returns bytes."""
    for p, shape in released:
        p.data = torch.empty(shape, dtype=p.dtype, device=p.device)
    return sum(p.numel() * p.element_size() for p, _ in released)


@dataclass(frozen=True)
class MemoryChange:
    """What one release or resume did: the tags released afterwards and this process's resident set size
    before and after (an engine server's own process is not counted: SGLang / vLLM hold their memory there)."""

    released: list[str]
    resident_before: int
    resident_after: int
    seconds: float


def change_memory(engine, release: bool, tags: Sequence[str] = ()) -> MemoryChange:
    """`engine.release_memory(tags)` (or `resume_memory`), measured; called by the rollout servicer."""
    check_tags(tags)
    before, start = resident_bytes(), time.perf_counter()
    released = engine.release_memory(tags) if release else engine.resume_memory(tags)
    return MemoryChange(list(released), before, resident_bytes(), time.perf_counter() - start)
