"""Launching an engine's HTTP server (SGLang, vLLM) as a child process, or naming a running one.

Used by the SGLang and vLLM engines. The server's flags come from `engine.<kind>.extra_args`
(keys with underscores become `--dashed-flags`; True is a bare flag, False is left out, a list
repeats its values). A launched server is stopped with its whole process group.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from meshrl.common.errors import DeadlineExceeded, InvalidArgument, Unavailable
from meshrl.common.suggest import did_you_mean

log = logging.getLogger(__name__)


def cli_flags(args: Mapping[str, Any]) -> list[str]:
    """{"tp_size": 2, "trust_remote_code": True, "x": False} -> ["--tp-size", "2", "--trust-remote-code"]."""
    out: list[str] = []
    for key, value in args.items():
        if not isinstance(key, str) or not key.replace("_", "").replace("-", "").isalnum():
            raise InvalidArgument(f"engine extra_args key {key!r} is not a server flag name (letters, digits, _)")
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            out += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            import json

            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out


def check_known_flags(args: Mapping[str, Any], known: Sequence[str] | None, engine: str) -> None:
    """Refuses a flag the engine does not know (when its argument list can be read)."""
    if known is None:
        return

    for key in args:
        if key not in known:
            hint = did_you_mean(key, known, "see the engine's server arguments")
            raise InvalidArgument(f"unknown {engine} server argument '{key}' in engine.{engine}.extra_args: {hint}")


class ServerProcess:
    """A launched engine server: its command, log file and process group."""

    def __init__(self, cmd: list[str], *, env: Mapping[str, str], log_file: str | None) -> None:
        self.cmd = cmd
        self.log_path = Path(log_file) if log_file else None
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 - child owns it
        log.info("launching engine server: %s", " ".join(cmd))
        self.proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True
        )
        if self.log_path:
            out.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 3000) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")[-chars:]
        return "(no log file: set engine.<kind>.log_file to keep the server's output)"

    def stop(self, grace: float = 15.0) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def python_executable(configured: str) -> str:
    return configured or sys.executable


def wait_healthy(
    client: httpx.Client, url: str, *, timeout: float, process: ServerProcess | None, path: str = "/health"
) -> None:
    """Polls GET url+path until 200; fails early when the launched process exits."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if process is not None and not process.alive():
            raise Unavailable(f"the engine server exited with code {process.proc.returncode}:\n{process.tail()}")
        try:
            reply = client.get(url + path, timeout=5.0)
            if reply.status_code == 200:
                return
            last = f"HTTP {reply.status_code}"
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(1.0)
    raise DeadlineExceeded(f"the engine server at {url} was not healthy within {timeout:.0f}s (last: {last})")
