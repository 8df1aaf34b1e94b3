"""Commit notifications: a put publishes the batch's tag on one pub/sub channel after its
manifest is committed, so a get waiting for that batch wakes at once (any service instance
over the same Redis). Waiters also re-check every `poll_seconds`, so a lost message (Redis
restarted, subscriber reconnecting) costs latency, never correctness.

Used by the batch store (`publish` after commit, `watch` in a waiting get).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import redis

log = logging.getLogger(__name__)


class CommitNotifier:
    def __init__(self, client: Any, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self, tag: str) -> None:
        try:
            self._client.publish(self._channel, tag)
        except redis.RedisError as exc:  # waiters fall back to polling
            log.debug("commit notification for %s not published: %s", tag, exc)

    @contextlib.contextmanager
    def watch(self, tag: str) -> Iterator[threading.Event]:
        """An event set when `tag` is committed; register it before checking for the batch."""
        self._ensure_listening()
        event = threading.Event()
        with self._lock:
            self._waiters.setdefault(tag, set()).add(event)
        try:
            yield event
        finally:
            with self._lock:
                group = self._waiters.get(tag)
                if group is not None:
                    group.discard(event)
                    if not group:
                        del self._waiters[tag]

    def _ensure_listening(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._listen, name="databuffer-notify", daemon=True)
                self._thread.start()

    def _listen(self) -> None:
        while not self._stopped.is_set():
            pubsub = None
            try:
                pubsub = self._client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self._channel)
                while not self._stopped.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message and message.get("type") == "message":
                        self._wake(message["data"])
            except (redis.RedisError, OSError, ValueError) as exc:
                log.debug("commit subscription lost (%s); waiters poll until it is back", exc)
                self._stopped.wait(0.5)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()

    def _wake(self, data: bytes | str) -> None:
        tag = data.decode() if isinstance(data, bytes) else data
        with self._lock:
            events = list(self._waiters.get(tag, ()))
        for event in events:
            event.set()

    def close(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
