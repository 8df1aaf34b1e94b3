"""What every experiment tracker backend implements (tensorboard.py, wandb_run.py, mlflow_run.py),
and the fan-out the job runner calls: `Trackers.log` per step and per evaluation, `finish` with the
run's plots at the end. A backend that fails is logged once and dropped: the job goes on.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class Tracker(Protocol):
    name: str

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_images(self, step: int, images: dict[str, Path]) -> None: ...

    def close(self) -> None: ...


def finite(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics trackers can store: numbers only, NaN and infinities left out."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"}: a nested config as flat string parameters."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = str(value)
    return out


class Trackers:
    """The trackers of one job; empty (and free) when logging.backends is empty."""

    def __init__(self, trackers: list[Tracker] | None = None) -> None:
        self.trackers = list(trackers or [])

    def _each(self, what: str, call) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as exc:  # a tracker must never stop the job
                log.warning("tracker %s failed to %s (%s); it is dropped for this job", tracker.name, what, exc)
                self.trackers.remove(tracker)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        values = finite(metrics)
        if values:
            self._each("log metrics", lambda t: t.log(step, values))

    def finish(self, step: int, plots: list[Path]) -> None:
        images = {f"plots/{p.stem}": p for p in plots if p.is_file()}
        if images:
            self._each("log plots", lambda t: t.log_images(step, images))
        self._each("close", lambda t: t.close())
        self.trackers = []
