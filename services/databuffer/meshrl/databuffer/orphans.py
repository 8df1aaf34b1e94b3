"""Clean-ups that could not run when they were due: the chunks a failed put staged while Redis was down.

`Batches` adds the put's staged generation here when its clean-up fails and retries the pending ones at the
start of each later put, so the chunks and their budget reservation go as soon as Redis answers again
instead of living out the staging TTL (an hour by default).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
MAX_PENDING = 10_000  # past this the oldest are left to their TTL


class PendingCleanups:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[Any, ...]] = []

    def add(self, item: tuple[Any, ...]) -> None:
        with self._lock:
            self._items.append(item)
            del self._items[:-MAX_PENDING]

    def __len__(self) -> int:
        return len(self._items)

    def retry(self, clean: Callable[..., None]) -> int:
        """Runs `clean(*item)` for each pending item; keeps those that fail again. Returns how many ran."""
        with self._lock:
            items, self._items = self._items, []
        done = 0
        for n, item in enumerate(items):
            try:
                clean(*item)
                done += 1
            except Exception as exc:  # noqa: BLE001 - still down: keep it (and the rest) for the next put
                log.debug("clean-up still failing (%s): %d kept", exc, len(items) - n)
                with self._lock:
                    self._items[:0] = items[n:]
                break
        return done
