"""A small deployment for the observability tests: the four services started as their own
processes (each serving Prometheus /metrics on its own port), a real Debian `prometheus` scraping
them when installed, and one two-step job submitted to the scheduler service with every tracker
backend on. conftest.py wraps it in a module fixture; the tests read what it left behind."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from meshrl.scheduler.launch.process import ServiceProcess

SERVICES = ("databuffer", "trainer", "rollout", "scheduler")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_json(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.loads(reply.read())


@dataclass
class Prometheus:
    """`prometheus` scraping `targets` every second, its data in `root`."""

    root: Path
    targets: list[str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, binary: str, timeout: float = 60.0) -> Prometheus:
        self.root.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "meshrl", "static_configs": [{"targets": self.targets}]}],
        }
        (self.root / "prometheus.yml").write_text(yaml.safe_dump(config))
        cmd = [
            binary,
            f"--config.file={self.root / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        log = open(self.root / "prometheus.log", "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"prometheus not ready in {timeout:.0f}s: {(self.root / 'prometheus.log').read_text()}")

    def query(self, promql: str) -> list[dict]:
        data = http_json(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert data["status"] == "success", data
        return data["data"]["result"]

    def wait_for(self, promql: str, count: int, timeout: float = 60.0) -> list[dict]:
        """The query's result once it has at least `count` series (scrapes run every second)."""
        deadline = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if len(result) >= count:
                return result
            time.sleep(0.5)
        return result

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def tiny_task(root: Path) -> dict:
    from meshrl.trainer.model_builder import build_small_model

    model = build_small_model(root / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(32)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    return {"model": str(model), "train": str(root / "train.jsonl"), "eval": str(root / "eval.jsonl")}


def start_services(root: Path, model: str, procs: dict[str, ServiceProcess]) -> tuple[dict[str, str], dict[str, int]]:
    """Each service as its own process with a Prometheus port, put in `procs` as it starts (so the caller
    stops what started even when one fails); returns (addresses, metric ports)."""
    addresses: dict[str, str] = {}
    metrics = {svc: free_port() for svc in SERVICES}
    extra = {
        "databuffer": ["--set", f"redis.embedded.data_dir={root / 'redis'}"],
        "trainer": [],
        "rollout": ["--set", f"engine.model_path={model}", "--set", "replica_id=rollout-0"],
        "scheduler": [
            "--set",
            f"run_root={root / 'runs'}",
            "--set",
            f"job_permissions.read_roots=[{json.dumps(str(root))}]",
        ],
    }

    def start(svc: str) -> str:
        if svc in ("trainer", "rollout"):  # the job's model, run folder and published weights lie under root
            extra[svc] += [
                "--set",
                f"databuffer_address={addresses['databuffer']}",
                "--set",
                f"paths.roots=[{json.dumps(str(root))}]",
            ]
        if svc == "scheduler":  # the job names the other services: the operator allows exactly them
            peers = ", ".join(f'"{addresses[s]}"' for s in SERVICES[:-1])
            extra[svc] += ["--set", f"job_permissions.peer_addresses=[{peers}]"]
        args = [
            *extra[svc],
            "--set",
            f"telemetry.prometheus_port={metrics[svc]}",
            "--set",
            "telemetry.prometheus_host=127.0.0.1",
            "--set",
            f"telemetry.instance={svc}",
        ]
        procs[svc] = ServiceProcess(svc, args, str(root / "logs" / f"{svc}.log"), exit_with_parent=True)
        return procs[svc].start(timeout=240)

    addresses["databuffer"] = start("databuffer")  # the others need its address
    with ThreadPoolExecutor(2) as pool:  # trainer and rollout start side by side
        started = {svc: pool.submit(start, svc) for svc in SERVICES[1:-1]}
        addresses.update({svc: future.result() for svc, future in started.items()})
    addresses["scheduler"] = start("scheduler")
    return addresses, metrics


def job_config(task: dict, addresses: dict[str, str], steps: int = 2) -> str:
    return yaml.safe_dump(
        {
            "job": {"name": "observed", "steps": steps},
            "model": {"path": task["model"]},
            "data": {"train": task["train"], "eval": task["eval"], "prompts_per_step": 4},
            "rollout": {"replicas": 0, "addresses": [addresses["rollout"]], "n": 2, "max_tokens": 6},
            "trainer": {"address": addresses["trainer"], "optimizer": {"lr": 1e-3}},
            "services": {"databuffer": addresses["databuffer"]},
            "eval": {"every": 1, "max_prompts": 4},
            "logging": {"backends": ["tensorboard", "wandb", "mlflow"], "project": "observed"},
        }
    )
