"""The step loop's client of a trainer group (`trainer_group.py`): the trainer's own client, except that a call
failing with an internal error while a rank of the group is gone fails as Unavailable, naming the rank.

When a rank > 0 dies, rank 0's next collective fails at once with its backend's error (gloo: "Connection reset
by peer"), which reaches the scheduler as INTERNAL, before or after the group's watch reports the rank. A dead
peer is what the job's recovery restarts the services for (`recovery.restartable`); an internal error is not.
So an internal error is checked against the group (`TrainerGroup.lost_rank`) and, when a rank is gone, raised as
Unavailable. Used by `launch.services.JobServices` for `trainer.launch: group`.
"""

from __future__ import annotations

import functools
from typing import Any

from meshrl.common.errors import Internal, Unavailable
from meshrl.scheduler.clients import TrainerClient


class GroupTrainerClient:
    """Every attribute is the wrapped TrainerClient's; its methods are checked as the module says."""

    def __init__(self, client: TrainerClient, group: Any, probe_seconds: float = 10.0) -> None:
        self.client = client
        self.group = group
        self.probe_seconds = probe_seconds

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.client, name)
        if not callable(value) or name == "close":
            return value

        @functools.wraps(value)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except Internal as exc:
                lost = self.group.lost_rank(self.probe_seconds)
                if lost is None:
                    raise
                raise Unavailable(f"trainer {lost}; the call failed with: {str(exc)[:500]}") from exc

        return checked
