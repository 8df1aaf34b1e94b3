"""The scheduler's own environment has no torch (services/scheduler/pyproject.toml): its modules must import
without it. A fast guard for what tests/integration/test_separate_envs.py shows with real environments."""

from __future__ import annotations

import subprocess
import sys

BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not installed in the scheduler's environment")
sys.meta_path.insert(0, Block())
import meshrl.scheduler.cli, meshrl.scheduler.jobs, meshrl.scheduler.server
import meshrl.scheduler.fleet.weight_sync, meshrl.scheduler.step.job.runner, meshrl.scheduler.clients
print("ok")
"""


def test_the_scheduler_imports_without_torch():
    done = subprocess.run([sys.executable, "-c", BLOCK_TORCH], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
