"""Every service's entry point: `--help` works, the server answers the gRPC health check and the
reflection listing, and stops cleanly (exit code 0) on SIGTERM."""

import signal
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from meshrl.common.grpc_channel import open_channel, wait_until_serving
from meshrl.scheduler.launch.process import ServiceProcess

SERVICES = {
    "databuffer": "meshrl.databuffer.v1.DataBuffer",
    "trainer": "meshrl.trainer.v1.Trainer",
    "rollout": "meshrl.rollout.v1.Rollout",
    "scheduler": "meshrl.scheduler.v1.Scheduler",
}


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_help(service):
    out = subprocess.run(
        [sys.executable, "-m", f"meshrl.{service}", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "--config" in out.stdout and "--set" in out.stdout


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from meshrl.trainer.model_builder import build_small_model

    return str(
        build_small_model(
            tmp_path_factory.mktemp("m") / "model", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1
        )
    )


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_serves_health_and_reflection_then_stops_on_sigterm(service, model, tmp_path):
    args = {
        "databuffer": ["--set", f"redis.embedded.data_dir={tmp_path / 'redis'}"],
        "rollout": ["--set", f"engine.model_path={model}"],
        "scheduler": ["--set", f"run_root={tmp_path / 'runs'}"],
        "trainer": [],
    }[service]
    proc = ServiceProcess(service, ["--port", "0", *args], str(tmp_path / f"{service}.log"), exit_with_parent=False)
    address = proc.start(timeout=120)
    try:
        channel = open_channel(address)
        wait_until_serving(channel, timeout=60, service=SERVICES[service])
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        )
        names = {s.name for r in replies for s in r.list_services_response.service}
        assert {SERVICES[service], "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
        channel.close()
    finally:
        proc.proc.send_signal(signal.SIGTERM)
        code = proc.proc.wait(90)
    assert code == 0, (tmp_path / f"{service}.log").read_text()[-2000:]
    with pytest.raises(grpc.RpcError):
        health_pb2_grpc.HealthStub(grpc.insecure_channel(address)).Check(health_pb2.HealthCheckRequest(), timeout=2)
