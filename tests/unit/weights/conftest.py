"""Shared helpers of the weight-plane tests: tiny deterministic tensor sets, free ports, spawned members."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # spawned members import _weights_workers by name
