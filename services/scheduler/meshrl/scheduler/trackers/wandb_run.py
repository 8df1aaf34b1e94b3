"""Weights & Biases backend: one W&B run per job in project `logging.project`, offline by default
(RUN/wandb/offline-run-*; `wandb sync` uploads it when there is a network) or online. Metrics per
step, the config, the plots as images. Opened by trackers.open_trackers.
"""

from __future__ import annotations

from pathlib import Path


class WandbTracker:
    name = "wandb"

    def __init__(self, directory: Path, project: str, mode: str, run_name: str, config: dict) -> None:
        import wandb

        Path(directory).mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_meta=True)
        self.run = wandb.init(
            project=project,
            dir=str(directory),
            mode=mode,
            name=run_name,
            config=config,
            settings=settings,
            reinit="create_new",
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        import wandb

        self.run.log({tag: wandb.Image(str(path)) for tag, path in images.items()}, step=step)

    def close(self) -> None:
        self.run.finish()
