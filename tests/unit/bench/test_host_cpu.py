"""bench/async's host CPU figure: the busy share of all CPUs between two instants, from /proc/stat samples."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[3] / "bench" / "async" / "host_cpu.py"
spec = importlib.util.spec_from_file_location("bench_async_host_cpu", PATH)
host_cpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_cpu)


def test_busy_is_the_share_of_jiffies_between_the_nearest_samples_inside_the_window():
    cpu = host_cpu.HostCpu()
    cpu.samples = [(0.0, 100, 1000), (1.0, 150, 1100), (2.0, 250, 1300), (3.0, 260, 1500)]
    assert cpu.busy(0.5, 2.5) == pytest.approx(100 / 200)  # samples at 1.0 and 2.0
    assert cpu.busy(0.0, 3.0) == pytest.approx(160 / 500)
    assert cpu.busy(1.5, 2.5) is None  # one sample inside: no figure rather than a wrong one


@pytest.mark.skipif(not host_cpu.STAT.exists(), reason="needs Linux /proc/stat")
def test_the_sampler_reads_this_host():
    with host_cpu.HostCpu(interval=0.05) as cpu:
        end = time.time() + 0.3
        while time.time() < end:
            sum(range(1000))  # keep one core busy
    busy = cpu.busy(cpu.samples[0][0], cpu.samples[-1][0])
    assert len(cpu.samples) >= 3 and busy is not None and 0.0 < busy <= 1.0
