"""TensorBoard backend: event files written by tensorboardX (no TensorFlow) under
logging.tensorboard_dir (default RUN/tensorboard); `tensorboard --logdir RUN/tensorboard` shows them.
Scalars per step, the config as text, the plots as images. Opened by trackers.open_trackers.
"""

from __future__ import annotations

from pathlib import Path

import yaml


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, logdir: Path, config: dict) -> None:
        from tensorboardX import SummaryWriter

        self.logdir = Path(logdir)
        self.writer = SummaryWriter(logdir=str(self.logdir), flush_secs=5)
        text = yaml.safe_dump(config, sort_keys=False)
        self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        from matplotlib import image

        for tag, path in images.items():
            pixels = image.imread(str(path))[..., :3]  # H x W x RGB floats in [0, 1]
            self.writer.add_image(tag, pixels, step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
