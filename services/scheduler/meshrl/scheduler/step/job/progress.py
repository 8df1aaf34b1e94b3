"""The live progress display of `meshrl run`: one line per step with reward, response length,
per-node times, tokens/s and ETA, over a rich progress bar (plain lines when not a TTY).
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class StepProgress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.progress = Progress(
            TextColumn("[bold]RL"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not (enabled and sys.stderr.isatty()),
        )
        self.task = self.progress.add_task("steps", total=total, completed=start, status="")
        self.started = time.monotonic()

    def __enter__(self) -> StepProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def note(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, highlight=False)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        times = " ".join(f"{k.removeprefix('time/')}={v:.1f}s" for k, v in metrics.items() if k.startswith("time/"))
        line = (
            f"step {step:4d}  reward {metrics.get('reward/mean', float('nan')):.3f}  "
            f"acc {metrics.get('reward/accuracy', float('nan')):.3f}  "
            f"len {metrics.get('response/length_mean', float('nan')):.1f}  "
            f"tok/s {metrics.get('rollout/tokens_per_second', float('nan')):.0f}  "
            f"step {metrics.get('time/step', float('nan')):.1f}s  [{times}]"
        )
        self.note(line)
        self.progress.update(self.task, advance=1, status=f"reward {metrics.get('reward/mean', 0):.2f}")
