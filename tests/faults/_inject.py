"""Finding a job's service processes (by their command lines) to inject faults into them."""

from __future__ import annotations

import os
from pathlib import Path


def _procs() -> list[tuple[int, int, str]]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.append((int(entry.name), ppid, cmd))
    return out


def service_pids(run_dir: Path, service: str, name: str = "") -> list[int]:
    """Pids of `python -m meshrl.<service>` launched for the run in `run_dir` (by `name`, e.g. rollout-1)."""
    return [
        pid
        for pid, _, cmd in _procs()
        if f"-m meshrl.{service} " in cmd
        and str(run_dir) in cmd
        and (not name or f"replica_id={name} " in cmd + " ")
        and pid != os.getpid()
    ]


def child_pids(parent: int, needle: str) -> list[int]:
    return [pid for pid, ppid, cmd in _procs() if ppid == parent and needle in cmd]
