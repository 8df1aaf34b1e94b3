"""Keeps the services of `meshrl up` running: a detached process that starts them, restarts one that dies on
the same address (so the job-config overlay and running jobs stay valid), and stops them all on SIGTERM.

`meshrl up` (local_cluster.py) writes STATE_DIR/plan.json and starts this as
`python -m meshrl.scheduler.launch.supervisor STATE_DIR`; the supervisor writes STATE_DIR/services.json
(addresses, pids, restarts) once every service serves, and rewrites it after each restart. Its own log,
one line per start, exit, restart and give-up, is STATE_DIR/logs/supervisor.log. `meshrl down` sends it SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from meshrl.common.errors import MeshrlError
from meshrl.scheduler.launch.process import ServiceProcess


class RestartPolicy(BaseModel):
    """How often a dead service is started again before the supervisor leaves it down."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_restarts: int = Field(5, ge=0, description="restarts allowed within window_seconds; then it stays down")
    window_seconds: float = Field(600.0, gt=0)
    backoff_seconds: float = Field(1.0, ge=0, description="wait before the first restart; doubles each time")
    max_backoff_seconds: float = Field(30.0, ge=0)
    start_timeout_seconds: float = Field(180.0, gt=0)


class PlannedService(BaseModel):
    """One service of the plan: `python -m meshrl.<service> ARGS`, known as `name`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    service: str
    name: str
    args: list[str]  # "{name}" in an arg stands for the address of service `name` of an earlier stage


class Plan(BaseModel):
    """What `meshrl up` asks the supervisor to run, in start order (each stage after the one before serves)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    stages: list[list[PlannedService]]
    policy: RestartPolicy = RestartPolicy()


@dataclass
class Supervised:
    planned: PlannedService
    proc: ServiceProcess
    address: str = ""
    restarts: int = 0
    recent: deque = field(default_factory=deque)  # monotonic times of the restarts within the window
    next_try: float = 0.0  # monotonic time of the next restart attempt, 0 when none is due
    given_up: bool = False

    def entry(self) -> dict:
        return {
            "name": self.planned.name,
            "service": self.planned.service,
            "address": self.address,
            "pid": self.proc.pid,
            "restarts": self.restarts,
            "up": not self.given_up,
        }


def _fill(arg: str, addresses: dict[str, str]) -> str:
    for name, address in addresses.items():
        arg = arg.replace("{" + name + "}", address)
    return arg


class Supervisor:
    def __init__(self, state: Path, plan: Plan) -> None:
        self.state = state
        self.plan = plan
        self.members: list[Supervised] = []
        self.stopping = threading.Event()
        self.starting: list[ServiceProcess] = []  # being started now: a stop must not wait for them
        self.log_file = open(state / "logs" / "supervisor.log", "a", buffering=1)  # noqa: SIM115 - our lifetime

    def log(self, message: str) -> None:
        self.log_file.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}\n")

    def _write_record(self) -> None:
        tmp = self.state / "services.json.tmp"
        tmp.write_text(json.dumps([m.entry() for m in self.members], indent=2))
        tmp.replace(self.state / "services.json")

    def start_all(self) -> None:
        """Starts the plan stage by stage; each service's port is kept for its restarts."""
        addresses: dict[str, str] = {}
        for stage in self.plan.stages:
            batch = []
            for planned in stage:
                args = [_fill(a, addresses) for a in planned.args]
                log_path = self.state / "logs" / f"{planned.name}.log"
                batch.append(
                    Supervised(planned, ServiceProcess(planned.service, args, str(log_path), exit_with_parent=False))
                )
            pool = ThreadPoolExecutor(max_workers=len(batch), thread_name_prefix="meshrl-up")
            self.starting = [m.proc for m in batch]
            futures = [pool.submit(m.proc.start, self.plan.policy.start_timeout_seconds) for m in batch]
            wait(futures)
            self.starting = []
            pool.shutdown(wait=False)
            self.members += batch
            errors = [f.exception() for f in futures if f.exception() is not None]
            if errors:
                raise errors[0]
            for m, f in zip(batch, futures):
                m.address = f.result()
                m.proc.args = [*m.proc.args, "--port", m.address.rsplit(":", 1)[1]]  # restarts keep the address
                addresses[m.planned.name] = m.address
                self.log(f"started {m.planned.name} at {m.address} (pid {m.proc.pid})")
        self._write_record()

    def _due(self, m: Supervised, now: float) -> None:
        """A member found dead: its process group is cleared, and a restart is scheduled within the budget."""
        code = m.proc.proc.poll() if m.proc.proc else None
        try:  # children it left (an embedded redis-server) would hold its socket and files
            os.killpg(m.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        policy = self.plan.policy
        while m.recent and now - m.recent[0] > policy.window_seconds:
            m.recent.popleft()
        if len(m.recent) >= policy.max_restarts:
            m.given_up = True
            self.log(
                f"{m.planned.name} exited (code {code}); {len(m.recent)} restarts within "
                f"{policy.window_seconds:.0f}s: left down (see logs/{m.planned.name}.log)"
            )
            self._write_record()
            return
        delay = min(policy.backoff_seconds * 2 ** len(m.recent), policy.max_backoff_seconds)
        m.next_try = now + delay
        self.log(f"{m.planned.name} exited (code {code}); restarting in {delay:.1f}s")

    def _restart(self, m: Supervised) -> None:
        m.next_try = 0.0
        m.recent.append(time.monotonic())
        m.restarts += 1
        self.starting = [m.proc]
        try:
            address = m.proc.start(self.plan.policy.start_timeout_seconds)
        except MeshrlError as exc:
            if self.stopping.is_set():
                return
            self.log(f"{m.planned.name} restart {m.restarts} failed: {str(exc)[-500:]}")
            self._due(m, time.monotonic())
            return
        finally:
            self.starting = []
        if address != m.address:
            self.log(f"{m.planned.name} came back at {address}, not {m.address}")
        self.log(f"restarted {m.planned.name} at {address} (pid {m.proc.pid}, restart {m.restarts})")
        self._write_record()

    def watch(self, interval: float = 0.2) -> None:
        """Until SIGTERM: restarts dead members after their backoff."""
        while not self.stopping.wait(interval):
            now = time.monotonic()
            for m in self.members:
                if m.given_up or m.proc.alive():
                    continue
                if not m.next_try:
                    self._due(m, now)
                elif now >= m.next_try:
                    self._restart(m)

    def on_signal(self, *_) -> None:
        """SIGTERM / SIGINT: stop watching, and end any start in progress now (its wait ends with it)."""
        self.stopping.set()
        for proc in self.starting:
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGTERM)

    def stop_all(self, grace: float = 15.0) -> None:
        for m in reversed(self.members):
            m.proc.stop(grace)
        self.log("stopped every service")


def main(argv: list[str]) -> int:
    state = Path(argv[0])
    plan = Plan.model_validate_json((state / "plan.json").read_text())
    supervisor = Supervisor(state, plan)
    signal.signal(signal.SIGTERM, supervisor.on_signal)
    signal.signal(signal.SIGINT, supervisor.on_signal)
    try:
        supervisor.start_all()
    except BaseException as exc:
        supervisor.log(f"start failed: {type(exc).__name__}: {exc}")
        supervisor.stop_all(grace=5)
        (state / "start_failed").write_text(f"{type(exc).__name__}: {exc}")
        return 2
    supervisor.watch()
    supervisor.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
