"""Long-lived streams cannot hold a server's thread pool: idle Health/Watch streams (open to anyone, no token)
hold no thread however many there are, with tracing and metrics on, and still hear NOT_SERVING at shutdown; the
streams that do hold a thread (WatchJob, reflection) are bounded by server.max_long_streams, one more refused
with RESOURCE_EXHAUSTED while calls keep being answered."""

from __future__ import annotations

import time

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
from meshrl.common.grpc_server import ServerConfig, Service, start_server
from meshrl.common.telemetry import TelemetryConfig, setup_telemetry, shutdown_telemetry
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.server import SchedulerServicer
from meshrl.scheduler.workflow import builtin_workflow_text


def _echo_service() -> Service:
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    handler = grpc.method_handlers_generic_handler("probe.Echo", {"Echo": echo})
    return Service(lambda _servicer, server: server.add_generic_rpc_handlers((handler,)), None, "probe.Echo")


def test_idle_health_watchers_hold_no_thread(tmp_path):
    setup_telemetry("probe", TelemetryConfig(exporter="file", path=str(tmp_path / "spans.jsonl"), prometheus_port=0))
    running = start_server(ServerConfig(port=0, max_workers=4), [_echo_service()])
    channels = [grpc.insecure_channel(running.address) for _ in range(4)]
    watchers = []
    try:
        for i in range(40):  # ten times the server's threads
            stream = health_pb2_grpc.HealthStub(channels[i % 4]).Watch(health_pb2.HealthCheckRequest(), timeout=60)
            assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
            watchers.append(stream)
        started = time.monotonic()
        assert channels[0].unary_unary("/probe.Echo/Echo")(b"x", timeout=5) == b"x"
        assert time.monotonic() - started < 2
        running.health.enter_graceful_shutdown()
        assert next(watchers[-1]).status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        for stream in watchers:
            stream.cancel()
        for channel in channels:
            channel.close()
        running.stop(0)
        shutdown_telemetry()


def _config(tmp_path) -> str:
    return yaml.safe_dump(
        {"job": {"name": "w"}, "model": {"path": str(tmp_path / "m")}, "data": {"train": str(tmp_path / "t.jsonl")}}
    )


def test_watch_job_streams_are_bounded_and_calls_still_answer(tmp_path):
    jobs = JobManager(run_root=str(tmp_path / "runs"))
    record = jobs.create(builtin_workflow_text("grpo"), _config(tmp_path), [], job_id="held")  # never started
    record.events.log("waiting")
    service = Service(scheduler_pb2_grpc.add_SchedulerServicer_to_server, SchedulerServicer(jobs), "s")
    running = start_server(ServerConfig(port=0, max_workers=4), [service])  # at most 2 long streams
    channel = grpc.insecure_channel(running.address)
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    watch = spb.WatchJobRequest(job_id="held")
    try:
        held = [stub.WatchJob(watch, timeout=60) for _ in range(2)]
        for stream in held:
            next(stream)  # both are open, each on a server thread
        with pytest.raises(grpc.RpcError) as info:
            next(stub.WatchJob(watch, timeout=60))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "server.max_long_streams" in info.value.details()
        assert stub.GetJob(spb.GetJobRequest(job_id="held"), timeout=5).job_id == "held"
        held.pop().cancel()
        deadline = time.monotonic() + 10
        while True:  # the cancelled stream's slot comes back within its handler's next poll (1 s)
            again = stub.WatchJob(watch, timeout=60)
            try:
                next(again)
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
                time.sleep(0.2)
        again.cancel()
        for stream in held:
            stream.cancel()
    finally:
        channel.close()
        running.stop(0)
