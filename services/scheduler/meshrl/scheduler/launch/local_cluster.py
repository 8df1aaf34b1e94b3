"""`meshrl up` / `meshrl down`: a local set of independent service processes for development.

`up` starts a data buffer (embedded Redis unless --redis-url), then a trainer, N rollout
replicas and a scheduler service side by side, each its own process that outlives the command,
and writes their addresses to STATE_DIR/services.json plus a job-config overlay
(STATE_DIR/services.yaml) that points a job at them:
`meshrl submit WORKFLOW --config job.yaml --config .meshrl/services.yaml`.
`down` stops them (SIGTERM, then SIGKILL), checking first that each pid still runs that service.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import yaml

from meshrl.common.errors import MeshrlError
from meshrl.scheduler.launch.process import ServiceProcess


def _start_together(state: Path, items: list[tuple[str, str, list[str]]], timeout: float) -> list[dict]:
    """Starts (service, name, args) processes side by side; stops them all if any fails or we are interrupted."""
    procs = [
        (name, ServiceProcess(service, args, str(state / "logs" / f"{name}.log"), exit_with_parent=False))
        for service, name, args in items
    ]
    pool = ThreadPoolExecutor(max_workers=len(procs), thread_name_prefix="meshrl-up")
    futures = [pool.submit(proc.start, timeout) for _, proc in procs]
    try:
        addresses = [f.result() for f in futures]
    except BaseException:
        for _, proc in procs:  # a failed start stops itself; the others are told to stop here
            proc.stop(grace=5)
        wait(futures)  # a start racing the stop above ends promptly once its process is gone
        for _, proc in procs:
            proc.stop(grace=5)
        raise
    finally:
        pool.shutdown(wait=False)
    return [
        {"name": name, "service": proc.service, "address": address, "pid": proc.pid}
        for (name, proc), address in zip(procs, addresses)
    ]


def up(args) -> int:
    state = Path(args.state_dir)
    if (state / "services.json").exists():
        print(f"{state}/services.json exists: run `meshrl down --state-dir {state}` first")
        return 1
    state.mkdir(parents=True, exist_ok=True)
    redis = ["--set", f"redis.url={args.redis_url}"] if args.redis_url else [
        "--set", f"redis.embedded.data_dir={state / 'redis'}"]  # fmt: skip
    started: list[dict] = []
    try:
        started += _start_together(state, [("databuffer", "databuffer", redis)], args.timeout)
        with_buffer = ["--set", f"databuffer_address={started[0]['address']}"]
        rest = [("trainer", "trainer", with_buffer)]
        for i in range(args.replicas):
            replica = [*with_buffer, "--set", f"engine.model_path={args.model}", "--set", f"replica_id=rollout-{i}"]
            rest.append(("rollout", f"rollout-{i}", replica))
        # --port 0: a free port, so several local clusters (and tests) can run side by side
        rest.append(("scheduler", "scheduler", ["--port", "0", "--set", f"run_root={state / 'runs'}"]))
        started += _start_together(state, rest, args.timeout)
    except BaseException:
        _stop_all(started)
        raise
    (state / "services.json").write_text(json.dumps(started, indent=2))
    by_name = {s["name"]: s["address"] for s in started}
    overlay = {
        # the services run already: the job only connects (no Ray cluster, no launched processes)
        "services": {"databuffer": by_name["databuffer"], "use_ray": False},
        "trainer": {"address": by_name["trainer"]},
        "rollout": {"replicas": 0, "addresses": [a for n, a in by_name.items() if n.startswith("rollout-")]},
    }
    (state / "services.yaml").write_text(yaml.safe_dump(overlay, sort_keys=False))
    for s in started:
        print(f"{s['name']:<12} {s['address']:<22} pid {s['pid']}")
    print(f"job config overlay for these services: {state / 'services.yaml'}")
    print(f"scheduler: export MESHRL_SCHEDULER={by_name['scheduler']}")
    return 0


def _runs_service(entry: dict) -> bool:
    """Whether entry's pid still runs `python -m meshrl.<service>` (a pid may be reused after a crash or reboot)."""
    try:
        argv = Path(f"/proc/{entry['pid']}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        if not Path("/proc/self").exists():  # no procfs (macOS): trust the recorded pid
            try:
                os.kill(entry["pid"], 0)
            except ProcessLookupError:
                return False
            return True
        return False
    except PermissionError:
        return False
    return f"meshrl.{entry['service']}".encode() in argv


def _stop_all(services: list[dict], grace: float = 15.0) -> None:
    """SIGTERM to each service still running, then SIGKILL to the process group of any left after `grace`."""
    running = [s for s in reversed(services) if _runs_service(s)]
    for s in running:
        try:
            os.kill(s["pid"], signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + grace
    for s in running:
        while time.monotonic() < deadline and _runs_service(s):
            time.sleep(0.1)
        if _runs_service(s):
            try:  # each service leads its own session: this also ends its children (embedded redis-server)
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
    gone = [s["name"] for s in services if not _runs_service(s)]
    _stop_all(services)
    path.unlink()
    (state / "services.yaml").unlink(missing_ok=True)
    print(
        f"stopped {len(services) - len(gone)} services" + (f" ({', '.join(gone)} had already exited)" if gone else "")
    )
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
    try:
        return up(args) if argv[0] == "up" else down(args)
    except MeshrlError as exc:
        print(f"meshrl {argv[0]}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
