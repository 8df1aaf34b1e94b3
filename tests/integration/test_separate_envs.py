"""Dependency separation, proven: each service is installed into its own virtual environment with only
libs/common and its own distribution (no torch in the databuffer's and the scheduler's), the four are
started from those environments, and a GRPO step submitted through the scheduler's gRPC API runs
through them.

The environments are built from the base interpreter of the running one (not the project venv) and
cached across runs in $MESHRL_TEST_ENVS (default ~/.cache/meshrl-test-envs), one folder per service
keyed by a hash of the pyproject files. The meshrl distributions go in as wheels built from a copy of
their folders (cached by a hash of their sources); when only the sources changed, the two are reinstalled
without dependencies. A cold build of the four takes a few minutes; the timings are printed (pytest -s).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from meshrl.api.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
from meshrl.common.grpc_channel import open_channel
from meshrl.common.grpc_server import EXIT_WITH_PARENT_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the timeout covers a cold build

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("databuffer", "scheduler", "trainer", "rollout")
EXTRA = {"trainer": ["torch==2.13.0"], "rollout": ["torch==2.13.0"]}  # this pin installs the local CPU wheel
NO_TORCH = ("databuffer", "scheduler")
BUILD_JUNK = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "dist", "*.egg-info")


def _digest(paths: list[Path], parts: list[str]) -> str:
    h = hashlib.sha256("\0".join(parts).encode())
    for path in paths:
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def _source_files(src: Path) -> list[Path]:
    files = []
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).parts
        junk = any(p in ("__pycache__", "build", "dist") or p.endswith(".egg-info") for p in rel)
        if path.is_file() and not junk and path.suffix != ".pyc":
            files.append(path)
    return files


class Wheels:
    """Wheels of the meshrl distributions, built once per source hash and shared by the environments.

    Built by the running interpreter without build isolation (its setuptools) from a copy of the
    source folder, so no build writes into the shared working tree.
    """

    def __init__(self, root: Path) -> None:
        self.root = root / "wheels"

    def get(self, src: Path) -> tuple[Path, str]:
        key = _digest(_source_files(src), [])
        out = self.root / f"{src.name}-{key}"
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{src.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (out / ".ok").exists():
                for old in self.root.glob(f"{src.name}-*"):
                    shutil.rmtree(old, ignore_errors=True)
                with tempfile.TemporaryDirectory(prefix=f"meshrl-{src.name}-src-") as stage:
                    copy = shutil.copytree(src, Path(stage) / src.name, ignore=BUILD_JUNK)
                    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out)]
                    built = subprocess.run([*cmd, str(copy)], capture_output=True, text=True, timeout=300)
                if built.returncode != 0:
                    raise RuntimeError(
                        f"building the wheel of {src} failed:\n{built.stdout[-2000:]}{built.stderr[-3000:]}"
                    )
                (out / ".ok").write_text(key)
        (wheel,) = out.glob("*.whl")
        return wheel, key


@dataclass
class ServiceEnv:
    """One service's virtual environment in the cache, made from the base interpreter."""

    svc: str
    root: Path
    base_python: str
    seconds: float = 0.0
    action: str = "reused"
    deps_key: str = field(init=False)

    def __post_init__(self) -> None:
        pyprojects = [src / "pyproject.toml" for src in self.sources]
        self.deps_key = _digest(pyprojects, [self.base_python, sys.version, *EXTRA.get(self.svc, [])])

    @property
    def sources(self) -> list[Path]:
        return [REPO / "libs" / "common", REPO / "services" / self.svc]

    @property
    def path(self) -> Path:
        return self.root / f"{self.svc}-{self.deps_key}"

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def env(self) -> dict[str, str]:
        """The process environment of this venv: nothing of the project venv or the caller's meshrl config leaks in."""
        drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")
        env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("MESHRL_")}
        env.update(VIRTUAL_ENV=str(self.path), PATH=f"{self.path / 'bin'}:{env.get('PATH', '')}")
        # installed with --no-compile; the first start writes the bytecode of what the service imports,
        # so later starts are fast (PYTHONDONTWRITEBYTECODE, set on some machines, would forbid that)
        env.update(PYTHONSAFEPATH="1", PYTHONUNBUFFERED="1")
        return env

    def ensure(self, wheels: Wheels) -> ServiceEnv:
        """Builds the environment, reinstalls its meshrl distributions if their sources changed, or reuses it."""
        started = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{self.svc}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            built = [wheels.get(src) for src in self.sources]
            src_key = "-".join(key for _, key in built)
            deps_stamp, src_stamp = self.path / ".meshrl-deps", self.path / ".meshrl-src"
            if not deps_stamp.exists():
                for old in self.root.glob(f"{self.svc}-*"):  # other pyproject hashes: up to ~1.2 GB each
                    shutil.rmtree(old, ignore_errors=True)
                subprocess.run([self.base_python, "-m", "venv", str(self.path)], check=True, capture_output=True)
                self._pip_install([str(w) for w, _ in built] + EXTRA.get(self.svc, []))
                deps_stamp.write_text(self.deps_key)
                self.action = "built"
            elif not src_stamp.exists() or src_stamp.read_text() != src_key:
                self._pip_install(["--no-deps", "--force-reinstall", *(str(w) for w, _ in built)])
                self.action = "refreshed"
            src_stamp.write_text(src_key)
        self.seconds = time.monotonic() - started
        return self

    def _pip_install(self, args: list[str]) -> None:
        cmd = [self.python, "-m", "pip", "install", "--no-compile", "--disable-pip-version-check", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, env=self.env(), timeout=900)
        (self.path / "pip-install.log").write_text(out.stdout + out.stderr)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-4000:]}")

    def packages(self) -> dict[str, str]:
        cmd = [self.python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"]
        out = subprocess.run(cmd, capture_output=True, text=True, env=self.env(), check=True, timeout=120)
        return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out.stdout)}

    def python_run(self, code: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.python, "-c", code], capture_output=True, text=True, env=self.env(), timeout=120)


def _env_root() -> Path:
    return Path(os.environ.get("MESHRL_TEST_ENVS") or Path.home() / ".cache" / "meshrl-test-envs")


@pytest.fixture(scope="module")
def envs() -> dict[str, ServiceEnv]:
    base = getattr(sys, "_base_executable", sys.executable)  # the interpreter the project venv was made from
    started = time.monotonic()
    wheels = Wheels(_env_root())
    # largest first, two at a time: pip mostly unpacks and writes files, and this machine has 2 cores
    wanted = [ServiceEnv(svc, _env_root(), base) for svc in ("scheduler", "trainer", "rollout", "databuffer")]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda e: e.ensure(wheels), wanted))
    total = time.monotonic() - started
    print(f"\nservice environments under {_env_root()} ({total:.1f}s wall):")
    for e in done:
        print(f"  {e.svc:<11} {e.action:<9} {e.seconds:6.1f}s  {e.path}")
    return {e.svc: e for e in done}


@dataclass
class Running:
    name: str
    proc: subprocess.Popen
    address: str


class Services:
    """Service processes started from their environments; all stopped on close (SIGTERM, then SIGKILL)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.running: dict[str, Running] = {}

    def start(self, env: ServiceEnv, name: str, args: list[str]) -> subprocess.Popen:
        port_file, log = self.workdir / f"{name}.port", self.workdir / f"{name}.log"
        cmd = [env.python, "-m", f"meshrl.{env.svc}", "--port", "0", *args, "--set", f"server.port_file={port_file}"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
                env={**env.env(), EXIT_WITH_PARENT_ENV: "1"},
            )
        self.running[name] = Running(name, proc, "")
        return proc

    def wait(self, name: str, timeout: float = 180) -> str:
        """The address of `name` once it has written its port file."""
        run = self.running[name]
        port_file, deadline = self.workdir / f"{name}.port", time.monotonic() + timeout
        while not port_file.exists():
            if run.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"{name} did not start (exit code {run.proc.poll()}):\n{tail}")
            time.sleep(0.1)
        run.address = f"127.0.0.1:{port_file.read_text().strip()}"
        return run.address

    def terminate(self, grace: float = 15) -> dict[str, int | None]:
        """SIGTERM to each, then their exit codes (None: still running after `grace`)."""
        for run in reversed(list(self.running.values())):
            if run.proc.poll() is None:
                run.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for run in self.running.values():
            try:
                run.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return {name: run.proc.poll() for name, run in self.running.items()}

    def close(self) -> None:
        self.terminate()
        for run in self.running.values():
            try:  # the service's whole session: an embedded redis-server left behind too
                os.killpg(run.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            run.proc.wait(10)


@pytest.fixture
def services(tmp_path):
    running = Services(tmp_path)
    yield running
    running.close()


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict:
    """A 1-layer model (built here, in the project venv) and an 'add one' task."""
    from meshrl.trainer.model_builder import build_small_model

    root = tmp_path_factory.mktemp("separate_envs")
    model = build_small_model(root / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(16)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"model": str(model), "train": str(root / "train.jsonl")}


def test_each_environment_holds_only_its_own_distribution(envs):
    for svc, env in envs.items():
        packages = env.packages()
        meshrl = {name for name in packages if name.startswith("meshrl")}
        assert meshrl == {"meshrl-common", f"meshrl-{svc}"}, f"{svc} environment holds {sorted(meshrl)}"
        others = [s for s in SERVICES if s != svc]
        probe = env.python_run(
            "import importlib.util as u, json; "
            f"print(json.dumps({{m: u.find_spec(m) is not None for m in {[f'meshrl.{s}' for s in others]}}}))"
        )
        assert probe.returncode == 0, probe.stderr
        assert not any(json.loads(probe.stdout).values()), f"{svc} environment can import {probe.stdout}"
        if svc in NO_TORCH:
            assert not any(name.startswith("torch") for name in packages), f"torch in the {svc} environment"
            imported = env.python_run("import torch")
            assert imported.returncode != 0 and "No module named 'torch'" in imported.stderr, imported.stderr
        else:
            assert packages["torch"] == "2.13.0+cpu", f"{svc} environment has torch {packages['torch']}"


def test_grpo_step_through_services_from_their_own_environments(envs, services, task, tmp_path):
    started = time.monotonic()
    redis_dir = tmp_path / "redis"
    services.start(envs["databuffer"], "databuffer", ["--set", f"redis.embedded.data_dir={redis_dir}"])
    buffer = services.wait("databuffer")
    folders = [str(Path(task["model"]).parent), str(tmp_path)]  # the task's model and data, the run folders
    with_buffer = ["--set", f"databuffer_address={buffer}", "--set", f"paths.roots={json.dumps(folders)}"]
    services.start(envs["trainer"], "trainer", with_buffer)
    services.start(envs["rollout"], "rollout", [*with_buffer, "--set", f"engine.model_path={task['model']}"])
    trainer, rollout = (services.wait(n) for n in ("trainer", "rollout"))
    permissions = [  # the operator allows the job to name these services and read the task's folder
        "--set",
        f"job_permissions.peer_addresses={json.dumps([buffer, trainer, rollout])}",
        "--set",
        f"job_permissions.read_roots={json.dumps(folders[:1])}",
    ]
    services.start(envs["scheduler"], "scheduler", ["--set", f"run_root={tmp_path / 'runs'}", *permissions])
    scheduler = services.wait("scheduler")
    print(f"four services started from their environments: {time.monotonic() - started:.1f}s")
    redis_pid = int((redis_dir / "redis.pid").read_text())  # the data buffer's embedded redis-server

    job = tmp_path / "job.yaml"
    job.write_text(
        json.dumps(
            {
                "job": {"name": "separate", "steps": 1, "run_root": str(tmp_path / "runs")},
                "model": {"path": task["model"]},
                "data": {"train": task["train"], "prompts_per_step": 4},
                "rollout": {"replicas": 0, "addresses": [rollout], "n": 2, "max_tokens": 6},
                "trainer": {"address": trainer, "optimizer": {"lr": 1e-3}},
                # named by address: the scheduler launches nothing (and so needs no Ray cluster)
                "services": {"databuffer": buffer, "use_ray": False},
                "eval": {"every": 0, "max_prompts": 4},
            }
        )
    )
    started = time.monotonic()
    meshrl = str(envs["scheduler"].path / "bin" / "meshrl")  # the scheduler distribution's own console script
    cmd = [meshrl, "submit", "grpo", "--config", str(job), "--scheduler", scheduler, "--job-id", "separate-1"]
    submit = subprocess.run(cmd, capture_output=True, text=True, env=envs["scheduler"].env(), timeout=120)
    assert submit.returncode == 0, submit.stdout + submit.stderr

    channel = open_channel(scheduler)
    try:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        events = list(stub.WatchJob(spb.WatchJobRequest(job_id="separate-1"), timeout=300))
        job_state = stub.GetJob(spb.GetJobRequest(job_id="separate-1"), timeout=30)
    finally:
        channel.close()
    print(f"1-step GRPO job through the four: {time.monotonic() - started:.1f}s")
    assert job_state.state == spb.JOB_STATE_SUCCEEDED, job_state.error
    assert job_state.step == 1 and job_state.total_steps == 1
    assert events[-1].WhichOneof("body") == "state" and events[-1].state.state == spb.JOB_STATE_SUCCEEDED

    metrics = dict(job_state.last_metrics)
    assert metrics["rollout/samples"] == 8 and metrics["weights/version"] == 2, metrics
    assert metrics["weights/stale_replicas"] == 0 and metrics["data/prompts"] == 4
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    (logged,) = [json.loads(line) for line in (Path(job_state.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert logged["step"] == 1 and logged["weights/version"] == 2

    # the published weights reached the replica that runs from the rollout environment
    channel = open_channel(rollout)
    try:
        status = rollout_pb2_grpc.RolloutStub(channel).GetStatus(rollout_pb2.GetStatusRequest(), timeout=30)
    finally:
        channel.close()
    assert status.weight_version == 2
    # and the scheduler ran the job with what it was given: no process of its own (no Ray, no services)
    scheduler_pid = services.running["scheduler"].proc.pid
    children = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == scheduler_pid]
    assert children == [], f"the scheduler started processes {children}"
    for run in services.running.values():
        assert run.proc.poll() is None, f"{run.name} exited during the job"

    codes = services.terminate()  # SIGTERM: each stops cleanly, and the data buffer takes its redis-server down
    assert codes == dict.fromkeys(services.running, 0), codes
    deadline = time.monotonic() + 10
    while _alive(redis_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(redis_pid), "the embedded redis-server outlived the data buffer"


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _ppid(proc_dir: Path) -> int | None:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
