"""The live view of runs in a browser (`meshrl ui RUN_ROOT`): server.py serves page.html and the
JSON state that state.py reads from each run folder."""

from meshrl.scheduler.liveview.server import LiveView

__all__ = ["LiveView"]
