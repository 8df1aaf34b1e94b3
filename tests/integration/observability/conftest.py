"""The package fixtures of the observability tests: four service processes, a Prometheus server
scraping them (when the Debian package is installed), the live view on the scheduler's run root,
and one two-step job -- `submitted` while it runs, `observed` once it has finished."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _deployment import Prometheus, job_config, prometheus_binary, start_services, tiny_task  # noqa: E402


def _wait_done(stub, job_id: str, timeout: float):
    from meshrl.api.scheduler.v1 import scheduler_pb2 as spb

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = stub.GetJob(spb.GetJobRequest(job_id=job_id), timeout=10)
        if job.state in (spb.JOB_STATE_SUCCEEDED, spb.JOB_STATE_FAILED, spb.JOB_STATE_CANCELLED):
            return job
        time.sleep(0.5)
    raise TimeoutError(f"job {job_id} did not finish in {timeout:.0f}s")


@pytest.fixture(scope="package")
def submitted(tmp_path_factory):
    """The deployment with its two-step job just submitted (still running): {"job": Job as submitted,
    "stub", "prometheus": Prometheus | None, "liveview": LiveView on the scheduler's run root, ...}."""
    from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
    from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
    from meshrl.common.grpc_channel import open_channel
    from meshrl.scheduler.liveview import LiveView

    root = tmp_path_factory.mktemp("observed")
    task = tiny_task(root)
    procs: dict = {}
    prometheus = None
    view = LiveView(root / "runs", port=0).start()
    try:
        addresses, metric_ports = start_services(root, task["model"], procs)
        binary = prometheus_binary()
        if binary is not None:
            targets = [f"127.0.0.1:{port}" for port in metric_ports.values()]
            prometheus = Prometheus(root / "prometheus", targets).start(binary)
        channel = open_channel(addresses["scheduler"])
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        job = stub.SubmitJob(
            spb.SubmitJobRequest(workflow_name="grpo", config_yaml=job_config(task, addresses)), timeout=120
        )
        yield {
            "job": job,
            "stub": stub,
            "prometheus": prometheus,
            "addresses": addresses,
            "metric_ports": metric_ports,
            "liveview": view,
        }
        channel.close()
    finally:
        view.stop()
        if prometheus is not None:
            prometheus.stop()
        with ThreadPoolExecutor(len(procs) or 1) as pool:  # SIGTERM all at once, each waits its own grace
            list(pool.map(lambda proc: proc.stop(grace=10), procs.values()))


@pytest.fixture(scope="package")
def observed(submitted):
    """The same deployment once the job has finished: adds "run_dir" and the finished "job"."""
    from meshrl.api.scheduler.v1 import scheduler_pb2 as spb

    job = _wait_done(submitted["stub"], submitted["job"].job_id, timeout=420)
    assert job.state == spb.JOB_STATE_SUCCEEDED, job.error
    return {**submitted, "job": job, "run_dir": Path(job.run_dir)}
