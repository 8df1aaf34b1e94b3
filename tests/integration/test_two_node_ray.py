"""A GRPO job on a real two-node Ray cluster whose nodes have distinct addresses (`ray start --head` on
127.0.0.2, a worker on 127.0.0.3, token auth on): the scheduler places its services on bundles spread over
both nodes, and each service binds and advertises its own node's address."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from meshrl.common.net import free_port

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(600)]
RAY = str(Path(sys.executable).parent / "ray")
HEAD, WORKER = "127.0.0.2", "127.0.0.3"
START_TRIES = 3


def _pids_of(*marks: str) -> list[int]:
    """Processes this test's cluster started: their command lines name its temp dir or its head's address."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(mark in cmdline for mark in marks):
            pids.append(int(proc.name))
    return pids


def _stop(temp_dir: Path, head: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):  # by pid: never a machine-wide `ray stop`
        for pid in _pids_of(str(temp_dir), head):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(2)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _start_cluster(env: dict[str, str]) -> tuple[Path, str]:
    """`ray start` for the head, then the worker; a try that fails (a port one of Ray's many components
    picked at random was taken, or a start under load timed out) is stopped and made again on a fresh port
    and temp dir, and the last failure's own output is what the error shows."""
    common = ["--num-cpus=4", "--disable-usage-stats"]
    failure = ""
    for _ in range(START_TRIES):
        temp_dir = Path(tempfile.mkdtemp(prefix="mrlray-", dir="/tmp"))  # short: Ray's socket paths have a length limit
        head = f"{HEAD}:{free_port(HEAD)}"
        env["RAY_TMPDIR"] = str(temp_dir)
        commands = (
            [
                RAY,
                "start",
                "--head",
                f"--node-ip-address={HEAD}",
                f"--port={head.rsplit(':', 1)[1]}",
                f"--temp-dir={temp_dir}",
                "--include-dashboard=false",
                *common,
            ],
            [RAY, "start", f"--address={head}", f"--node-ip-address={WORKER}", *common],
        )
        try:
            for command in commands:
                subprocess.run(command, env=env, check=True, capture_output=True, text=True, timeout=180)
            return temp_dir, head
        except subprocess.CalledProcessError as exc:
            failure = f"{' '.join(exc.cmd[:3])} exited {exc.returncode}:\n{exc.stdout[-2000:]}\n{exc.stderr[-3000:]}"
        except subprocess.TimeoutExpired as exc:
            failure = f"{' '.join(exc.cmd[:3])} ran past {exc.timeout}s"
        _stop(temp_dir, head)
    raise AssertionError(f"a two-node Ray cluster did not start in {START_TRIES} tries; the last: {failure}")


@pytest.fixture
def two_node_cluster(monkeypatch):
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    temp_dir, head = _start_cluster(env)
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR"):
        monkeypatch.setenv(key, env[key])
    try:
        yield head
    finally:
        _stop(temp_dir, head)


def test_a_job_on_two_ray_nodes_places_services_on_both(two_node_cluster, tmp_path):
    """`meshrl run` as its own process (Ray reads its auth mode when it is first imported, so the driver
    gets the cluster's token settings from its environment, as a user's shell would give them)."""
    from meshrl.trainer.model_builder import build_small_model

    model = build_small_model(tmp_path / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(32)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "job": {"name": "twonode", "steps": 1, "run_root": str(tmp_path / "runs")},
        "model": {"path": str(model)},
        "data": {"train": str(tmp_path / "train.jsonl"), "prompts_per_step": 4},
        "rollout": {"replicas": 1, "n": 2, "max_tokens": 6},
        "eval": {"every": 0},
        "trainer": {"optimizer": {"lr": 1e-3}},
        "services": {"use_ray": True, "ray_address": two_node_cluster, "placement_strategy": "SPREAD"},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "meshrl.scheduler.cli",
            "run",
            "grpo",
            "--config",
            str(tmp_path / "job.yaml"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=480,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    up = next(e["log"] for e in events if e.get("log", "").startswith("services up: "))
    addresses = yaml.safe_load(up[len("services up: ") :].replace("'", '"'))
    hosts = {name: address.rsplit(":", 1)[0] for name, address in addresses.items()}
    assert set(hosts) == {"databuffer", "trainer", "rollout-0"}
    assert set(hosts.values()) == {HEAD, WORKER}, hosts  # spread over both nodes, each its own node's address
    step = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert step["weights/version"] >= 1 and step["rollout/samples"] == 8
