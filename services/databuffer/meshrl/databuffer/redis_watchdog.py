"""The embedded Redis's supervisor: when its redis-server dies (killed, crashed), it is started again on
the same socket and data folder, so the append-only file brings back every acknowledged write and clients
ride the restart out with their retries (UNAVAILABLE within their deadline).

Started by `open_redis` for an embedded Redis; `RedisHandle.close` stops it before stopping Redis.
"""

from __future__ import annotations

import logging
import threading

from meshrl.common.errors import MeshrlError
from meshrl.databuffer.embedded import EmbeddedRedis

log = logging.getLogger(__name__)


class RedisWatchdog:
    def __init__(self, redis: EmbeddedRedis, interval: float = 0.2, start_timeout: float = 30.0) -> None:
        self.redis = redis
        self.interval = interval
        self.start_timeout = start_timeout
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="redis-watchdog", daemon=True)

    def start(self) -> RedisWatchdog:
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            proc = self.redis._proc
            if proc is None or proc.poll() is None:
                continue
            log.warning("embedded redis-server (pid %d) exited with %s: restarting it", proc.pid, proc.returncode)
            try:
                self.redis.start(self.start_timeout)
                self.restarts += 1
            except MeshrlError as exc:
                log.error("could not restart the embedded redis-server: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
