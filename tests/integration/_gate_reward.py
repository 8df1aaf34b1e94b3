"""A reward function for the multi-host test that holds the step while a gate file exists, so the
test can start a replica or drain one at a known point of the job (it runs in the scheduler process;
the gate's path comes from MESHRL_TEST_GATE). Scores like the built-in exact match."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from meshrl.scheduler.step.scoring.rewards import exact_match


def gated_exact_match(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    gate = Path(os.environ["MESHRL_TEST_GATE"])
    deadline = time.monotonic() + 300
    while gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return exact_match(prompts, responses, answers)
