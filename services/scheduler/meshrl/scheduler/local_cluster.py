"""`meshrl up` / `meshrl down`: a local set of independent service processes for development.

`up` starts a data buffer (embedded Redis unless --redis-url), a trainer, N rollout replicas
and a scheduler service, each its own process that outlives the command, and writes their
addresses to STATE_DIR/services.json plus a job-config overlay (STATE_DIR/services.yaml) that
points a job at them: `meshrl submit WORKFLOW --config job.yaml --config .meshrl/services.yaml`.
`down` stops them (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import yaml
from meshrl.scheduler.process import ServiceProcess


def _start(state: Path, service: str, name: str, args: list[str], timeout: float) -> dict:
    proc = ServiceProcess(service, args, str(state / "logs" / f"{name}.log"), exit_with_parent=False)
    address = proc.start(timeout)
    return {"name": name, "service": service, "address": address, "pid": proc.pid}


def up(args) -> int:
    state = Path(args.state_dir)
    if (state / "services.json").exists():
        print(f"{state}/services.json exists: run `meshrl down --state-dir {state}` first")
        return 1
    state.mkdir(parents=True, exist_ok=True)
    redis = ["--set", f"redis.url={args.redis_url}"] if args.redis_url else [
        "--set", f"redis.embedded.data_dir={state / 'redis'}"]  # fmt: skip
    started = []
    try:
        buffer = _start(state, "databuffer", "databuffer", redis, args.timeout)
        started.append(buffer)
        with_buffer = ["--set", f"databuffer_address={buffer['address']}"]
        started.append(_start(state, "trainer", "trainer", with_buffer, args.timeout))
        for i in range(args.replicas):
            replica = [*with_buffer, "--set", f"engine.model_path={args.model}", "--set", f"replica_id=rollout-{i}"]
            started.append(_start(state, "rollout", f"rollout-{i}", replica, args.timeout))
        started.append(_start(state, "scheduler", "scheduler", ["--set", f"run_root={state / 'runs'}"], args.timeout))
    except Exception:
        _stop_all(started)
        raise
    (state / "services.json").write_text(json.dumps(started, indent=2))
    by_name = {s["name"]: s["address"] for s in started}
    overlay = {
        "services": {"databuffer": by_name["databuffer"]},
        "trainer": {"address": by_name["trainer"]},
        "rollout": {"replicas": 0, "addresses": [a for n, a in by_name.items() if n.startswith("rollout-")]},
    }
    (state / "services.yaml").write_text(yaml.safe_dump(overlay, sort_keys=False))
    for s in started:
        print(f"{s['name']:<12} {s['address']:<22} pid {s['pid']}")
    print(f"job config overlay for these services: {state / 'services.yaml'}")
    print(f"scheduler: export MESHRL_SCHEDULER={by_name['scheduler']}")
    return 0


def _stop_all(services: list[dict], grace: float = 15.0) -> None:
    for s in reversed(services):
        try:
            os.kill(s["pid"], signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + grace
    for s in services:
        while time.monotonic() < deadline:
            try:
                os.kill(s["pid"], 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            try:
                os.killpg(s["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def down(args) -> int:
    state = Path(args.state_dir)
    path = state / "services.json"
    if not path.exists():
        print(f"nothing to stop: {path} does not exist")
        return 0
    services = json.loads(path.read_text())
    _stop_all(services)
    path.unlink()
    (state / "services.yaml").unlink(missing_ok=True)
    print(f"stopped {len(services)} services")
    return 0


def local_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"meshrl {argv[0]}", description=__doc__.split("\n")[0])
    parser.add_argument("--state-dir", default=".meshrl", help="where addresses, pids and logs are kept")
    if argv[0] == "up":
        parser.add_argument("--model", required=True, help="Hugging Face model folder the replicas serve")
        parser.add_argument("--replicas", type=int, default=1)
        parser.add_argument("--redis-url", help="use this Redis instead of an embedded one")
        parser.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args(argv[1:])
    return up(args) if argv[0] == "up" else down(args)
