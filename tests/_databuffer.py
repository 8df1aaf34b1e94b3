"""Helpers for tests and benchmarks of the data buffer: free loopback ports, unique key
prefixes, a snapshot of every key under a prefix (to prove a failed call changed nothing),
an in-process service (and a client of one, `served_client`), and a three-node Redis Cluster on loopback ports.

Used by tests (as `tests._databuffer`) and by bench/databuffer and bench/rollout (which put the repository
root on sys.path); it is no part of the meshrl-databuffer distribution.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import redis

from meshrl.common.databuffer_client import DataBufferClient, Group
from meshrl.common.direct_path import DirectPathConfig
from meshrl.common.grpc_server import RunningServer, start_server
from meshrl.common.net import free_port
from meshrl.databuffer.config import DataBufferConfig
from meshrl.databuffer.server import service
from meshrl.databuffer.store import DataBuffer

SYSTEM_REDIS = "redis://127.0.0.1:6379/0"
SYSTEM_REDIS_SERVER = "/usr/bin/redis-server"


def unique_prefix(tag: str = "t") -> str:
    return f"mdbtest-{tag}-{uuid.uuid4().hex[:10]}"


def snapshot(client: redis.Redis, prefix: str) -> dict[bytes, bytes]:
    """Every key under `prefix` (as laid out by KeySpace) with its DUMP: equal snapshots, equal stores."""
    out = {}
    for key in client.scan_iter(match="{" + prefix + ":*", count=1000):
        value = client.dump(key)
        if value is not None:
            out[key] = value
    return out


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match="{" + prefix + ":*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])


@contextlib.contextmanager
def serving(cfg: DataBufferConfig) -> Iterator[tuple[DataBuffer, RunningServer]]:
    """A DataBuffer and its gRPC server in this process, stopped on exit."""
    buffer = DataBuffer.open(cfg)
    running = start_server(cfg.server, [service(buffer)])
    try:
        yield buffer, running
    finally:
        running.stop(0)
        buffer.close()


@contextlib.contextmanager
def served_client(tag: str, url: str = SYSTEM_REDIS) -> Iterator[DataBufferClient]:
    """A client of an in-process service on the Redis at `url`, under a fresh key prefix whose keys are deleted
    afterwards (the tests' usual data buffer)."""
    prefix = unique_prefix(tag)
    try:
        with serving(config(url, prefix)) as (_, running):
            client = DataBufferClient(running.address)
            try:
                yield client
            finally:
                client.close()
    finally:
        delete_prefix(redis.Redis.from_url(url), prefix)


@contextlib.contextmanager
def direct_and_relayed(
    cfg: DataBufferConfig, redis_url: str
) -> Iterator[tuple[DataBuffer, DataBufferClient, DataBufferClient]]:
    """`serving(cfg)` with two clients: one that takes the direct path for every batch (min_bytes 0, no
    fallback, Redis at `redis_url`) and one that relays everything through the service."""
    with serving(cfg) as (buffer, running):
        path = DirectPathConfig(redis_url=redis_url, fallback=False, min_bytes=0)
        direct = DataBufferClient(running.address, direct=path)
        relayed = DataBufferClient(running.address)
        try:
            relayed.wait_until_ready(10)
            yield buffer, direct, relayed
        finally:
            direct.close()
            relayed.close()


def config(url: str | None, prefix: str, cluster: bool = False, **sections: Any) -> DataBufferConfig:
    """A test config: server on a free port, `url` (None: embedded Redis) under `prefix`."""
    data: dict[str, Any] = {"server": {"port": 0}, "redis": {"url": url, "key_prefix": prefix, "cluster": cluster}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return DataBufferConfig.model_validate(data)


def run_producers_and_consumers(
    addresses: list[str], producers: int = 8, consumers: int = 8, per_producer: int = 24, job: str = "job"
) -> tuple[set[str], Counter, Counter, list[BaseException]]:
    """Producer and consumer threads (each with its own client, spread over `addresses`) on stream
    `s` of `job`; consumers ack each group on its own. Returns (expected group ids, acks per group,
    deliveries per group, errors)."""
    expected = {f"p{p}-{i}" for p in range(producers) for i in range(per_producer)}
    acks: Counter = Counter()
    deliveries: Counter = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def produce(p: int) -> None:
        client = DataBufferClient(addresses[p % len(addresses)])
        try:
            for i in range(0, per_producer, 3):
                groups = [Group(f"p{p}-{j}", p, {"x": np.full((4, 2), j)}) for j in range(i, min(i + 3, per_producer))]
                client.append_groups(job, "s", groups)
        except BaseException as exc:  # noqa: BLE001 - returned to the caller
            errors.append(exc)
        finally:
            client.close()

    def consume(c: int) -> None:
        client = DataBufferClient(addresses[c % len(addresses)])
        deadline = time.monotonic() + 90
        try:
            while time.monotonic() < deadline:
                with lock:
                    if sum(acks.values()) >= len(expected):
                        return
                result = client.read_groups(job, "s", "train", f"c{c}", max_groups=4, block_seconds=0.2)
                for g in result.groups:
                    if g.batch["x"].shape != (4, 2) or g.weight_version != int(g.group_id[1:].split("-")[0]):
                        raise AssertionError(f"group {g.group_id} arrived altered: {g}")
                    n = client.ack(job, "s", "train", [g.entry_id])
                    with lock:
                        deliveries[g.group_id] += 1
                        acks[g.group_id] += n
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    threads += [threading.Thread(target=consume, args=(c,)) for c in range(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return expected, acks, deliveries, errors


class LocalCluster:
    """Three redis-server processes in cluster mode on loopback ports, slots split between them."""

    def __init__(self, nodes: int = 3, binary: str = SYSTEM_REDIS_SERVER) -> None:
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="mdb-cluster-"))
        self.ports = [free_port(also_free=10000) for _ in range(nodes)]
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}"

    def start(self, timeout: float = 30.0) -> LocalCluster:
        for port in self.ports:
            node_dir = self.dir / str(port)
            node_dir.mkdir()
            args = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes"]
            args += ["--cluster-config-file", "nodes.conf", "--dir", str(node_dir), "--save", "", "--appendonly", "no"]
            args += ["--cluster-node-timeout", "5000", "--logfile", str(node_dir / "redis.log")]
            self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        clients = [redis.Redis(port=p, socket_timeout=5) for p in self.ports]
        try:
            self._until(lambda: all(c.ping() for c in clients), timeout, "nodes answering")
            slots = 16384 // len(self.ports)
            for i, c in enumerate(clients):
                end = 16383 if i == len(clients) - 1 else (i + 1) * slots - 1
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * slots, end)
            for port in self.ports[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
            self._until(
                lambda: all(b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO") for c in clients),
                timeout,
                "cluster_state:ok",
            )
        except BaseException:
            self.stop()
            raise
        finally:
            for c in clients:
                c.close()
        return self

    @staticmethod
    def _until(check: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(redis.RedisError):
                if check():
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"local Redis Cluster: no {what} within {timeout:.0f}s")
            time.sleep(0.1)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
