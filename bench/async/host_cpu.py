"""How busy the host's CPUs were over a window: the ceiling on what overlapping generation with training can
gain. Overlap only fills cores that a synchronous step leaves idle, so a sync run that keeps a fraction b of
the host busy cannot be sped up by more than a factor b by any asynchronous mode (with the same work per step).

`HostCpu` samples /proc/stat (Linux; elsewhere it records nothing and reports None) every `interval` seconds
in a daemon thread; `busy(t0, t1)` is the busy share of all CPUs between two `time.time()` instants.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

STAT = Path("/proc/stat")


def read_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot; idle and iowait count as idle."""
    if not STAT.exists():
        return None
    fields = [int(x) for x in STAT.read_text().splitlines()[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - fields[3] - fields[4], total


class HostCpu:
    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-cpu", daemon=True)

    def __enter__(self) -> HostCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            got = read_jiffies()
            if got is not None:
                self.samples.append((time.time(), *got))
            if self._stop.wait(self.interval):
                return

    def busy(self, t0: float, t1: float) -> float | None:
        """Busy share of the host's CPUs between t0 and t1 (the samples nearest inside), or None."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2 or inside[-1][2] == inside[0][2]:
            return None
        (_, b0, n0), (_, b1, n1) = inside[0], inside[-1]
        return (b1 - b0) / (n1 - n0)
