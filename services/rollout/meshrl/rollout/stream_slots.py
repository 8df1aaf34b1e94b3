"""How many GenerateStream calls a replica serves at once (`limits.max_streams`). Each stream holds a server
thread for as long as it generates (and its client reads), so without a bound a busy multi-turn job, or a caller
holding streams open, takes every thread and weight updates, pauses and batches queue behind them. One stream
more is refused at once with RESOURCE_EXHAUSTED, naming the setting.

Used by `RolloutReplica.stream`; `RolloutConfig` sizes the server's threads above the bound.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from meshrl.common.errors import ResourceExhausted


class StreamSlots:
    """At most `limit` streams hold a slot; `held()` takes one for a stream's life or refuses at once."""

    def __init__(self, limit: int, replica_id: str = "") -> None:
        self.limit = limit
        self.replica_id = replica_id
        self._lock = threading.Lock()
        self._in_use = 0

    @property
    def in_use(self) -> int:
        return self._in_use

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._in_use >= self.limit:
                raise ResourceExhausted(
                    f"rollout replica {self.replica_id or '(unnamed)'} already serves {self.limit} GenerateStream "
                    "calls, each holding a server thread; retry later or on another replica. Operators: raise "
                    "limits.max_streams (the server's threads follow it unless server.max_workers is set)"
                )
            self._in_use += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_use -= 1
