"""Small files that must survive a crash whole or not at all (a run's job state, a checkpoint's COMPLETE
marker): written to a temporary file beside the target, fsynced, renamed over it, and the folder fsynced.

Called by the scheduler's run folder (meshrl.scheduler.rundir); a reader sees the old file or the new one,
never a torn mix.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_durably(path: str | Path, data: bytes) -> None:
    """Replaces `path` with `data` atomically and durably (temp + fsync + rename + fsync of the folder)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
