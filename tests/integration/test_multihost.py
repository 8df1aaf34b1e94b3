"""Services that really run apart, on simulated hosts (one loopback address each, 127.0.0.2 …):
Redis and the data buffer on one host, the trainer on another, two rollout replicas on two more and
the scheduler on a fifth, each started by hand from its own YAML config with mutual TLS and a token
on its server and on every client channel.

- Each service refuses a raw channel without credentials, with a wrong token and with a certificate
  from a foreign CA; a service whose own client channel is misconfigured fails at start naming the peer.
- A GRPO job submitted (CLI, mTLS + token) to the scheduler builds its fleet from the replica registry and
  publishes weights over a weight group whose members prove the services' token (stream.py).
  While it runs a third replica is started by hand on a sixth host (refitted and verified before its
  first request, which the trace spans name) and one replica is drained with SIGTERM. Every step
  completes with no sample lost or duplicated, and every service advertises its own host's address.

The figures (steps, samples lost / duplicated, a newcomer's start to first request, drain time) are
printed: `pytest tests/integration/test_multihost.py -s`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
from meshrl.common.grpc_channel import ChannelConfig, open_channel
from meshrl.common.registry import ReplicaRegistry
from meshrl.common.security import AuthConfig, ClientTLSConfig
from meshrl.common.telemetry.span_file import read_span_file

from ._hosts import PKI, Cluster, Redis, meshrl_cli, traces

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(600)]

HOSTS = {
    "databuffer": "127.0.0.2",
    "trainer": "127.0.0.3",
    "rollout-a": "127.0.0.4",
    "rollout-b": "127.0.0.5",
    "scheduler": "127.0.0.6",
    "rollout-c": "127.0.0.7",
    "misconfigured": "127.0.0.8",
}
NAMESPACE = "multihost"
STEPS, PROMPTS, N = 8, 6, 2  # 6 prompts: one 2-prompt range for each of 3 replicas


def _telemetry(root: Path, name: str) -> dict:
    return {"exporter": "file", "path": str(traces(root) / f"{name}.jsonl"), "instance": name}


def _rollout_config(world: dict, name: str) -> dict:
    pki, root = world["pki"], world["root"]
    return {
        "server": pki.server(name, HOSTS[name]),
        "replica_id": name,
        "engine": {"model_path": world["model"], "max_batch_size": 16},
        "databuffer": pki.channel(name, world["addresses"]["databuffer"]),
        "registry": {
            "redis_url": world["registry_url"],
            "namespace": NAMESPACE,
            "ttl_seconds": 3,
            "heartbeat_seconds": 0.5,
        },
        "drain_timeout_s": 60,
        "paths": {"roots": [str(root)]},  # the run's published weights
        "telemetry": _telemetry(root, name),
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from meshrl.trainer.model_builder import build_small_model

    root = tmp_path_factory.mktemp("multihost")
    model = str(build_small_model(root / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0))
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(32)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pki = PKI(root / "pki", sorted(set(HOSTS.values())))
    redis = Redis(HOSTS["databuffer"], root / "redis")
    cluster = Cluster(root)
    world = {
        "root": root,
        "model": model,
        "pki": pki,
        "cluster": cluster,
        "addresses": cluster.addresses,
        "registry_url": f"{redis.url}/1",
    }
    try:
        cluster.start(
            "databuffer",
            "databuffer",
            {
                "server": pki.server("databuffer", HOSTS["databuffer"]),
                "redis": {"url": f"{redis.url}/0"},
                "telemetry": _telemetry(root, "databuffer"),
            },
        )
        cluster.start(
            "trainer",
            "trainer",
            {
                "server": pki.server("trainer", HOSTS["trainer"]),
                "torch_threads": 1,
                "paths": {"roots": [str(root)]},
                "databuffer": pki.channel("trainer", cluster.addresses["databuffer"]),
                "telemetry": _telemetry(root, "trainer"),
            },
        )
        with ThreadPoolExecutor(2) as pool:  # the two replicas start side by side, as on two hosts
            list(pool.map(lambda n: cluster.start("rollout", n, _rollout_config(world, n)), ("rollout-a", "rollout-b")))
        world["gate"] = root / "gate"
        peer = pki.channel("scheduler")  # the operator's channels and permissions; jobs only name what is allowed
        permissions = {
            "peer_addresses": [
                cluster.addresses["trainer"],
                cluster.addresses["databuffer"],
                world["registry_url"],
                HOSTS["trainer"],
            ],  # weights.group_address
            "read_roots": [str(root)],
        }
        cluster.start(
            "scheduler",
            "scheduler",
            {
                "server": pki.server("scheduler", HOSTS["scheduler"]),
                "run_root": str(root / "runs"),
                "allowed_modules": ["meshrl", "tests.integration"],  # the gate reward
                "channels": {"databuffer": peer, "trainer": peer, "rollout": peer},
                "job_permissions": permissions,
                "telemetry": _telemetry(root, "scheduler"),
            },
            env={"MESHRL_TEST_GATE": str(world["gate"])},
        )
        yield world
    finally:
        cluster.close()
        redis.stop()


def _raw_channel(address: str, *, tls: ClientTLSConfig | None, token_file: str | None) -> grpc.Channel:
    auth = AuthConfig(token_file=token_file, token_env="MESHRL_MULTIHOST_UNSET")
    return open_channel(address, ChannelConfig(tls=tls, auth=auth, retry_max_attempts=1))


def _refusal(channel: grpc.Channel) -> grpc.StatusCode:
    """The status of one call on `channel` (UNIMPLEMENTED means it got past TLS and the token)."""
    try:
        channel.unary_unary("/meshrl.test.v1.Probe/Check")(b"", timeout=5, wait_for_ready=False)
    except grpc.RpcError as exc:
        return exc.code()
    finally:
        channel.close()
    return grpc.StatusCode.OK


def test_every_service_refuses_unauthenticated_channels(world, monkeypatch):
    monkeypatch.delenv("MESHRL_MULTIHOST_UNSET", raising=False)
    pki = world["pki"]
    cert, key = pki.cert("client")
    foreign_cert, foreign_key = pki.foreign.issue("intruder", ips=tuple(HOSTS.values()))
    good_tls = ClientTLSConfig(ca_file=pki.ca.cert_file, cert_file=cert, key_file=key)
    foreign_tls = ClientTLSConfig(ca_file=pki.ca.cert_file, cert_file=foreign_cert, key_file=foreign_key)
    for name in ("databuffer", "trainer", "rollout-a", "rollout-b", "scheduler"):
        address = world["addresses"][name]
        assert address.startswith(HOSTS[name] + ":"), f"{name} advertises {address}, not its host {HOSTS[name]}"
        cases = {
            "no credentials (plaintext)": _refusal(_raw_channel(address, tls=None, token_file=None)),
            "TLS without a token": _refusal(_raw_channel(address, tls=good_tls, token_file=None)),
            "a wrong token": _refusal(_raw_channel(address, tls=good_tls, token_file=str(pki.wrong_token))),
            "a foreign CA's certificate": _refusal(_raw_channel(address, tls=foreign_tls, token_file=str(pki.token))),
        }
        assert cases["no credentials (plaintext)"] == grpc.StatusCode.UNAVAILABLE, (name, cases)
        assert cases["TLS without a token"] == grpc.StatusCode.UNAUTHENTICATED, (name, cases)
        assert cases["a wrong token"] == grpc.StatusCode.UNAUTHENTICATED, (name, cases)
        assert cases["a foreign CA's certificate"] == grpc.StatusCode.UNAVAILABLE, (name, cases)
        good = _raw_channel(address, tls=good_tls, token_file=str(pki.token))
        assert _refusal(good) == grpc.StatusCode.UNIMPLEMENTED, f"{name} refused the right credentials"


@pytest.mark.parametrize(
    "service, change, words",
    [
        ("trainer", {"tls": None}, "databuffer.tls"),
        ("rollout", {"auth": {"token_file": "WRONG"}}, "databuffer.auth.token_file"),
        ("rollout", {"tls": {"cert_file": "FOREIGN", "key_file": "FOREIGN_KEY"}}, "databuffer.tls.cert_file"),
    ],
)
def test_a_service_with_a_misconfigured_peer_fails_at_start(world, service, change, words):
    pki, cluster = world["pki"], world["cluster"]
    foreign_cert, foreign_key = pki.foreign.issue("stray")
    names = {"WRONG": str(pki.wrong_token), "FOREIGN": foreign_cert, "FOREIGN_KEY": foreign_key}
    name = "misconfigured"
    if service == "rollout":
        data = _rollout_config(world, name)
        data["registry"] = {}
    else:
        data = {
            "server": pki.server(name, HOSTS[name]),
            "databuffer": pki.channel(name, world["addresses"]["databuffer"]),
        }
    channel = data["databuffer"]
    channel["check_seconds"] = 5
    for section, values in change.items():
        channel[section] = None if values is None else {**channel[section], **{k: names[v] for k, v in values.items()}}
    config = cluster.config(f"{name}-{service}", data)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", f"meshrl.{service}", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "the data buffer" in proc.stderr and words in proc.stderr and "Fix:" in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - started < 60


def _job_config(world: dict) -> dict:
    addresses = world["addresses"]
    return {
        "job": {"name": "multihost", "steps": STEPS, "allowed_modules": ["meshrl", "tests.integration"]},
        "model": {"path": world["model"]},
        "data": {"train": str(world["root"] / "train.jsonl"), "prompts_per_step": PROMPTS},
        "rollout": {
            "replicas": 0,
            "n": N,
            "max_tokens": 8,
            "registry": {"redis_url": world["registry_url"], "namespace": NAMESPACE},
        },
        "trainer": {"address": addresses["trainer"], "optimizer": {"lr": 1e-3}},
        "services": {"databuffer": addresses["databuffer"], "use_ray": False},  # channels: the scheduler's
        "eval": {"every": 0, "max_prompts": 4},
        # the weight group on the trainer's host, secured: its members prove the services' token (stream.py)
        "weights": {"transport": "distributed", "group_address": HOSTS["trainer"]},
        "algorithm": {"reward": "tests.integration._gate_reward:gated_exact_match"},  # holds steps on a gate file
    }


class Watch:
    """Follows the job's events (log lines, step metrics) on a secured channel, in a thread."""

    def __init__(self, stub, job_id: str) -> None:
        self.logs: list[tuple[float, str]] = []
        self.metrics: dict[int, dict[str, float]] = {}
        self.step_times: dict[int, float] = {}
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(stub, job_id), daemon=True)
        self._thread.start()

    def _run(self, stub, job_id: str) -> None:
        try:
            for event in stub.WatchJob(spb.WatchJobRequest(job_id=job_id), timeout=540):
                body = event.WhichOneof("body")
                if body == "log":
                    self.logs.append((time.time(), event.log))
                elif body == "metrics":
                    self.metrics[event.metrics.step] = dict(event.metrics.metrics)
                    self.step_times[event.metrics.step] = time.time()
        finally:
            self.done.set()

    def wait_for(self, predicate, timeout: float, what: str) -> float:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline and not self.done.is_set(), f"{what} did not happen: {self.logs[-5:]}"
            time.sleep(0.1)
        return time.time()


def _first_generation(span_file: Path, timeout: float = 60.0) -> tuple[float, int]:
    """The replica's first GenerateBatch as its own server span; polled for, since a running service exports
    its spans from a background batch (every few seconds, later on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_span_file(span_file)
        spans = [s for s in records if s.name.endswith("GenerateBatch") and s.kind == "SERVER"]
        if spans or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert spans, (
        f"no GenerateBatch server span in {span_file.name} after {timeout:.0f}s: {sorted({s.name for s in records})}"
    )
    first = min(spans, key=lambda s: s.start_ns)
    return first.start_ns / 1e9, int(first.attributes.get("meshrl.weight_version", -1))


def test_grpo_job_across_hosts_with_a_replica_joining_and_one_draining(world):
    pki, cluster, root = world["pki"], world["cluster"], world["root"]
    job_file = cluster.config("job", _job_config(world))
    cert, key = pki.cert("cli")
    scheduler = world["addresses"]["scheduler"]
    security = ["--tls-ca", pki.ca.cert_file, "--tls-cert", cert, "--tls-key", key, "--token-file", str(pki.token)]
    submit = subprocess.run(
        [
            *meshrl_cli(),
            "submit",
            "grpo",
            "--config",
            str(job_file),
            "--scheduler",
            scheduler,
            "--job-id",
            "mh-1",
            *security,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submit.returncode == 0, submit.stdout + submit.stderr
    channel = open_channel(scheduler, ChannelConfig.model_validate(pki.channel("cli")))
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    watch = Watch(stub, "mh-1")
    registry = ReplicaRegistry(world["registry_url"], namespace=NAMESPACE)

    gate = world["gate"]
    watch.wait_for(lambda: len(watch.metrics) >= 1, 300, "the first step")
    gate.touch()  # the job holds in a step's reward while the third replica starts by hand
    cluster.start("rollout", "rollout-c", _rollout_config(world, "rollout-c"))
    newcomer = cluster.addresses["rollout-c"]
    serving_at = time.time()
    registry.wait_for(lambda rs: any(r.replica_id == "rollout-c" for r in rs), timeout=60)
    registered_at = time.time()
    gate.unlink()
    watch.wait_for(lambda: any(newcomer in line and "joined" in line for _, line in watch.logs), 240, "the join")
    joined_at_step = max(watch.metrics)
    watch.wait_for(lambda: max(watch.metrics) > joined_at_step, 240, "a step with the newcomer")
    running = stub.GetJob(spb.GetJobRequest(job_id="mh-1"), timeout=30)  # where it runs: `meshrl status JOB`
    where = {(p.service, p.address) for p in running.placements}
    assert {("trainer", cluster.addresses["trainer"]), ("databuffer", cluster.addresses["databuffer"])} <= where
    assert ("rollout", newcomer) in where, where  # joined through the registry, listed by the fleet
    with pytest.raises(grpc.RpcError) as scale:  # it did not launch these replicas: it says so
        stub.ScaleService(spb.ScaleServiceRequest(job_id="mh-1", service="rollout", replicas=4), timeout=120)
    assert scale.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "kubectl scale" in scale.value.details() and "cannot start or stop" in scale.value.details()
    gate.touch()  # hold again: rollout-b is drained mid-job, steps remain after it leaves
    drained = cluster.procs["rollout-b"]
    term_at = time.time()
    drained.proc.send_signal(signal.SIGTERM)
    drained.proc.wait(90)
    drain_seconds = time.time() - term_at
    drained_at_step = max(watch.metrics)
    gate.unlink()
    watch.wait_for(watch.done.is_set, 400, "the job's end")
    job = stub.GetJob(spb.GetJobRequest(job_id="mh-1"), timeout=30)
    channel.close()

    assert job.state == spb.JOB_STATE_SUCCEEDED, job.error + cluster.log("scheduler")[-3000:]
    steps = sorted(watch.metrics)
    assert steps == list(range(1, STEPS + 1))
    samples = [watch.metrics[s]["rollout/samples"] for s in steps]
    expected = PROMPTS * N
    lost = sum(max(0, expected - s) for s in samples)
    duplicated = sum(max(0, s - expected) for s in samples)
    assert (lost, duplicated) == (0, 0), samples
    assert drained.proc.returncode == 0, cluster.log("rollout-b")[-2000:]
    assert joined_at_step < drained_at_step < STEPS - 1, (joined_at_step, drained_at_step)
    after = [watch.metrics[s]["rollout/replicas"] for s in steps if s > drained_at_step + 1]
    assert after and all(r <= 2 for r in after), after  # rollout-b got no work after it left

    first_at, first_version = _first_generation(traces(root) / "rollout-c.jsonl")
    join_log = next(line for _, line in watch.logs if newcomer in line and "joined" in line)
    joined_version = int(join_log.split("weight version ")[1].split()[0])
    assert first_version >= joined_version, (first_version, join_log)  # served the current version first
    assert {s.instance for s in read_span_file(traces(root) / "rollout-c.jsonl")} == {"rollout-c"}
    updates = [s for s in read_span_file(traces(root) / "rollout-a.jsonl") if s.name.endswith("FromDistributed")]
    assert updates and all(s.status != "ERROR" for s in updates)  # over the weight group, secured by the token
    for name in ("rollout-a", "rollout-c"):
        info = registry.get(name)
        assert info is not None and info.address == cluster.addresses[name]
        assert info.address.startswith(HOSTS[name] + ":"), info
    assert registry.get("rollout-b") is None  # it deregistered when it left
    services_line = next(line for _, line in watch.logs if line.startswith("services up"))
    for name in ("databuffer", "trainer"):
        assert cluster.addresses[name] in services_line and cluster.addresses[name].startswith(HOSTS[name] + ":")

    start_to_first = first_at - cluster.started_at["rollout-c"]
    t0 = cluster.started_at["rollout-c"]
    timeline = {f"step {k}": round(v - t0, 1) for k, v in sorted(watch.step_times.items())}
    timeline.update(
        {
            "serving": round(serving_at - t0, 1),
            "registered": round(registered_at - t0, 1),
            "joined": round(next(t for t, line in watch.logs if newcomer in line and "joined" in line) - t0, 1),
            "first request": round(first_at - t0, 1),
            "SIGTERM to rollout-b": round(term_at - t0, 1),
        }
    )
    print(f"\ntimeline from rollout-c's start (s): {timeline}")
    joined_t = timeline["joined"]
    print(
        f"\nmultihost figures: rollout-c start to serving {timeline['serving']}s, serving to joined (refit + "
        f"verify at a step boundary) {joined_t - timeline['serving']:.1f}s, joined to first request "
        f"{timeline['first request'] - joined_t:.1f}s"
    )
    print(
        f"multihost figures: steps completed {len(steps)}/{STEPS}; samples lost/duplicated {lost}/{duplicated} "
        f"({sum(samples):.0f} samples, {expected} per step); newcomer rollout-c joined before step "
        f"{joined_at_step + 1}, start to first request {start_to_first:.1f}s (first request at weight version "
        f"{first_version}); drain of rollout-b (SIGTERM to exit) {drain_seconds:.2f}s, after step {drained_at_step}"
    )
