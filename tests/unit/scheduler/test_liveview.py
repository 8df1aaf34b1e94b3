"""The live view's server and state reader without a browser (the browser test is
tests/integration/observability/test_liveview.py): a run folder's files become the page's JSON,
half-written lines are skipped, and unknown or malformed run names get 404 with a message."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import yaml

from meshrl.scheduler.liveview import LiveView
from meshrl.scheduler.liveview.state import run_state


@pytest.fixture
def run_root(tmp_path):
    run = tmp_path / "job-1"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"job": {"steps": 3}}))
    events = [
        {"time": 10.0, "state": {"state": "JOB_STATE_RUNNING"}},
        {"time": 11.0, "node": {"step": "1", "nodeId": "rollout", "state": "NODE_STATE_RUNNING"}},
        {"time": 12.5, "node": {"step": "1", "nodeId": "rollout", "state": "NODE_STATE_COMPLETED", "seconds": 1.5}},
        {"time": 12.6, "node": {"step": "1", "nodeId": "train", "state": "NODE_STATE_RUNNING"}},
        {"time": 12.7, "log": "hello"},
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"time": 1')
    metrics = {
        "step": 1,
        "reward/mean": 0.5,
        "weights/version": 2,
        "reward/zero_variance_groups": 0.875,
        "actor/entropy": 0.12,
        "busy/trainer": 0.6,
        "busy/rollout": 0.3,
    }
    (run / "metrics.jsonl").write_text(json.dumps(metrics) + "\n")
    (run / "eval.jsonl").write_text(json.dumps({"step": 0, "eval/accuracy": 0.25}) + "\n")
    return tmp_path


def test_state_of_a_running_run(run_root):
    state = run_state(run_root / "job-1")
    assert (state["state"], state["step"], state["total_steps"], state["running_step"]) == ("RUNNING", 1, 3, 1)
    assert [(n["id"], n["state"], n["start"]) for n in state["nodes"]] == [
        ("rollout", "COMPLETED", 0.0),
        ("train", "RUNNING", pytest.approx(1.6)),
    ]
    assert state["curves"]["reward"] == [0.5] and state["eval"]["accuracy"] == [0.25]
    assert state["weights"]["version"] == 2 and state["log"] == ["hello"]
    # a start RL cannot learn from shows from the first steps: groups of one reward, low entropy
    assert state["curves"]["zero_variance_groups"] == [0.875] and state["curves"]["entropy"] == [0.12]
    # each side's busy share of the step, charted beside them
    assert state["curves"]["trainer_busy"] == [0.6] and state["curves"]["rollout_busy"] == [0.3]


def _get(url: str) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = reply.read().decode()
            return reply.status, json.loads(body) if "json" in reply.headers["Content-Type"] else body
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_server_serves_the_page_the_runs_and_refuses_bad_names(run_root):
    view = LiveView(run_root, port=0).start()
    try:
        status, page = _get(view.url + "/run/job-1")
        assert status == 200 and "meshrl live view" in page
        assert _get(view.url + "/api/runs") == (200, {"runs": ["job-1"]})
        assert _get(view.url + "/api/runs/job-1")[1]["state"] == "RUNNING"
        for bad in ("nosuch", "..%2F..%2Fetc", "a%20b"):
            status, body = _get(view.url + "/api/runs/" + bad)
            assert status == 404 and "no run named" in body["error"]
        assert _get(view.url + "/api/other")[0] == 404
    finally:
        view.stop()


def test_a_run_name_cannot_leave_the_run_root_and_a_foreign_host_is_refused(run_root, tmp_path):
    import http.client

    (run_root.parent / "events.jsonl").write_text("")  # `..` would name the run root's parent as a run
    (run_root / "link").symlink_to(tmp_path, target_is_directory=True)
    view = LiveView(run_root, port=0).start()
    host, port = view.httpd.server_address[:2]
    try:
        for name in ("..", ".", "link"):
            status, body = _get(f"{view.url}/api/runs/{name}")
            assert status == 404 and "no run named" in body["error"], (name, status, body)
        for header, expected in (("evil.example:80", 421), ("localhost", 200), (f"{host}:{port}", 200)):
            connection = http.client.HTTPConnection(host, port, timeout=10)
            connection.request("GET", "/api/runs/job-1", headers={"Host": header})
            reply = connection.getresponse()
            reply.read()
            connection.close()
            assert reply.status == expected, (header, reply.status)
    finally:
        view.stop()
