"""`meshrl up` / `meshrl down`: a local set of independent service processes for development.

`up` starts a supervisor (supervisor.py) that starts a data buffer (embedded Redis unless --redis-url),
then a trainer and N rollout replicas side by side, then a scheduler service, each its own process that
outlives the command and is restarted on its address when it dies. The supervisor records their
addresses in STATE_DIR/services.json; `up` adds a job-config overlay (STATE_DIR/services.yaml) that
points a job at them:
`meshrl submit WORKFLOW --config job.yaml --config .meshrl/services.yaml`.
The scheduler allows jobs to name these services and folders (--job-roots) and nothing else.
`--token-file FILE` secures the set: every service requires that token and every channel between them sends it.
`down` stops the supervisor, then them (SIGTERM, then SIGKILL), checking first that each pid still runs that service.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from meshrl.common.errors import DeadlineExceeded, MeshrlError, Unavailable
from meshrl.scheduler.launch.supervisor import Plan, PlannedService, RestartPolicy

SUPERVISOR = "scheduler.launch.supervisor"  # runs as `python -m meshrl.scheduler.launch.supervisor`


def _token_args(token_file: str | None) -> dict[str, list[str]]:
    """--token-file: every service requires the token (server.auth), and every channel between them sends it."""
    if not token_file:
        return {"server": [], "databuffer": [], "channels": []}
    path = str(Path(token_file).resolve())
    server = ["--set", f"server.auth.token_file={path}", "--set", "server.require_auth=true"]
    channels = [
        a for peer in ("databuffer", "trainer", "rollout") for a in ("--set", f"channels.{peer}.auth.token_file={path}")
    ]
    return {"server": server, "databuffer": ["--set", f"databuffer.auth.token_file={path}"], "channels": channels}


def _plan(args, state: Path) -> Plan:
    redis = (
        ["--set", f"redis.url={args.redis_url}"]
        if args.redis_url
        else ["--set", f"redis.embedded.data_dir={state / 'redis'}"]
    )
    # Jobs may read and write the run folders and --job-roots (default: this folder and the model's parent),
    # and the trainer and replicas may touch only those (meshrl.scheduler.job_permissions, paths.roots).
    folders = [str(Path(r).resolve()) for r in args.job_roots or [Path.cwd(), Path(args.model).parent]]
    runs = str((state / "runs").resolve())
    roots = ["--set", f"paths.roots={json.dumps([runs, *folders])}"]
    token = _token_args(args.token_file)
    redis += token["server"]
    with_buffer = ["--set", "databuffer_address={databuffer}", *roots, *token["server"], *token["databuffer"]]
    rest = [PlannedService(service="trainer", name="trainer", args=with_buffer)]
    for i in range(args.replicas):
        replica = [*with_buffer, "--set", f"engine.model_path={args.model}", "--set", f"replica_id=rollout-{i}"]
        rest.append(PlannedService(service="rollout", name=f"rollout-{i}", args=replica))
    # The scheduler starts last: its jobs may name these services and nothing else.
    peers = ", ".join(f'"{{{name}}}"' for name in ["databuffer", *(s.name for s in rest)])
    # --port 0: a free port, so several local clusters (and tests) can run side by side
    scheduler = [
        "--port",
        "0",
        "--set",
        f"run_root={runs}",
        "--set",
        f"job_permissions.peer_addresses=[{peers}]",
        "--set",
        f"job_permissions.write_roots={json.dumps(folders)}",
        *token["server"],
        *token["channels"],
    ]
    policy = RestartPolicy(max_restarts=args.max_restarts, start_timeout_seconds=args.timeout)
    stages = [
        [PlannedService(service="databuffer", name="databuffer", args=redis)],
        rest,
        [PlannedService(service="scheduler", name="scheduler", args=scheduler)],
    ]
    return Plan(stages=stages, policy=policy)


def _start_supervisor(state: Path, plan: Plan, timeout: float) -> list[dict]:
    """Starts the detached supervisor and waits until every service serves (or the start failed)."""
    (state / "logs").mkdir(parents=True, exist_ok=True)
    (state / "start_failed").unlink(missing_ok=True)
    (state / "plan.json").write_text(plan.model_dump_json(indent=2))
    with open(state / "logs" / "supervisor.out", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", f"meshrl.{SUPERVISOR}", str(state)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (state / "supervisor.json").write_text(json.dumps({"name": "supervisor", "service": SUPERVISOR, "pid": proc.pid}))
    deadline = time.monotonic() + 2 * timeout  # two stages, each within `timeout`
    try:
        while time.monotonic() < deadline:
            if (state / "services.json").exists():
                return json.loads((state / "services.json").read_text())
            if proc.poll() is not None:
                failed = state / "start_failed"
                out = state / "logs" / "supervisor.out"
                reason = failed.read_text() if failed.exists() else out.read_text()[-3000:]
                raise Unavailable(f"meshrl up: the services did not start: {reason}")
            time.sleep(0.1)
        raise DeadlineExceeded(f"meshrl up: the services did not all serve within {2 * timeout:.0f}s; see {state}/logs")
    except BaseException:  # a failed or interrupted start leaves nothing running
        _stop_all([json.loads((state / "supervisor.json").read_text())], grace=10)
        (state / "supervisor.json").unlink(missing_ok=True)
        (state / "services.json").unlink(missing_ok=True)
        raise


def up(args) -> int:
    state = Path(args.state_dir)
    if (state / "services.json").exists() or (state / "supervisor.json").exists():
        print(f"{state}/services.json exists: run `meshrl down --state-dir {state}` first")
        return 1
    state.mkdir(parents=True, exist_ok=True)
    started = _start_supervisor(state, _plan(args, state), args.timeout)
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
    print(f"supervised: a service that exits is restarted on its address (log: {state / 'logs' / 'supervisor.log'})")
    print(f"job config overlay for these services: {state / 'services.yaml'}")
    print(f"scheduler: export MESHRL_SCHEDULER={by_name['scheduler']}")
    if args.token_file:
        print(f"secured: every service requires the token in {args.token_file}; pass --token-file to the CLI")
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
    supervisor = state / "supervisor.json"
    if supervisor.exists():  # first, so that nothing is restarted while the services stop (it stops them)
        _stop_all([json.loads(supervisor.read_text())], grace=30)
        supervisor.unlink()
        services = json.loads(path.read_text())  # as it last wrote it (a restart changes a pid)
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
        parser.add_argument(
            "--token-file",
            metavar="FILE",
            help="secure the set: every service requires the token in FILE (server.auth) and sends it to its "
            "peers, and the weight group's members prove it; clients pass --token-file FILE",
        )
        parser.add_argument(
            "--job-roots",
            action="append",
            metavar="FOLDER",
            help="folders jobs may read and write besides the run folder (repeatable; default: "
            "this folder and the model's parent)",
        )
        parser.add_argument(
            "--max-restarts",
            type=int,
            default=5,
            help="restarts of one service within 10 minutes before it is left down",
        )
    args = parser.parse_args(argv[1:])
    if argv[0] == "up" and (args.max_restarts < 0 or args.replicas < 0):
        parser.error("--max-restarts and --replicas must be >= 0")
    try:
        return up(args) if argv[0] == "up" else down(args)
    except MeshrlError as exc:
        print(f"meshrl {argv[0]}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
