"""A real Prometheus server (the Debian `prometheus` package) scrapes the four services' /metrics
while a two-step job runs, and PromQL returns meshrl's step and node times and every service's
RPC durations -- the metric names deploy/grafana/meshrl-dashboard.json is built on."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def prometheus(observed):
    if observed["prometheus"] is None:
        pytest.skip("the `prometheus` server is not installed (Debian package prometheus; `make system-deps`)")
    return observed["prometheus"]


def test_every_service_is_scraped(prometheus):
    up = prometheus.wait_for('up{job="meshrl"} == 1', count=4)
    assert len(up) == 4, up


def test_step_and_node_durations_of_the_job(prometheus):
    steps = prometheus.wait_for("meshrl_step_duration_seconds_count", count=1)
    assert [float(s["value"][1]) for s in steps] == [2.0], steps
    nodes = prometheus.wait_for("sum by (meshrl_node_id) (meshrl_node_duration_seconds_count)", count=5)
    by_node = {s["metric"]["meshrl_node_id"]: float(s["value"][1]) for s in nodes}
    assert {"data_load", "rollout", "reward", "actor_train"} <= set(by_node), by_node
    assert all(count == 2.0 for count in by_node.values()), by_node


def test_rpc_durations_of_every_service(prometheus, observed):
    ports = {f"127.0.0.1:{port}": svc for svc, port in observed["metric_ports"].items()}
    series = prometheus.wait_for("sum by (instance, rpc_service) (rpc_server_duration_seconds_count)", count=4)
    served = {ports[s["metric"]["instance"]]: s["metric"]["rpc_service"] for s in series}
    assert set(served) == set(ports.values()), series
    assert served["scheduler"] == "meshrl.scheduler.v1.Scheduler"
    ok = prometheus.query('sum(rpc_server_duration_seconds_count{rpc_grpc_status_code="0"})')
    assert float(ok[0]["value"][1]) > 10, "the job made many successful calls"


def test_rollout_weight_versions(prometheus):
    versions = prometheus.wait_for("meshrl_weights_version", count=1)
    assert max(float(s["value"][1]) for s in versions) >= 2, versions
