"""A real Prometheus server (the Debian `prometheus` package) scrapes the four services' /metrics
while a two-step job runs, and PromQL returns meshrl's step and node times and every service's
RPC durations -- the metric names deploy/grafana/meshrl-dashboard.json is built on."""

from __future__ import annotations

import json
from pathlib import Path

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


DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "meshrl-dashboard.json"
# Panels allowed to be empty after a healthy job: nothing failed.
MAY_BE_EMPTY = {"RPC errors (non-OK status)"}


def _panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


@pytest.mark.parametrize(("title", "expr"), _panel_queries(), ids=[t for t, _ in _panel_queries()])
def test_every_grafana_panel_query_returns_data(prometheus, title, expr):
    """The dashboard's PromQL, with Grafana's variables filled in, runs on the scraped data."""
    promql = expr.replace("$__rate_interval", "5m").replace("$job", "meshrl")
    result = prometheus.wait_for(promql, count=0 if title in MAY_BE_EMPTY else 1, timeout=20)
    if title not in MAY_BE_EMPTY:
        assert result, f"{title}: {promql} returned nothing"
