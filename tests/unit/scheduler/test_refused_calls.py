"""Every scheduler RPC that changes state (SubmitJob, CancelJob, ScaleService), sent bad input over real gRPC:
each gets its status code and changes nothing (the job list, each job's state and the files under the run
root compared before and after). The allow-list, run-id and path cases are in test_job_policy.py one by one;
here each mutating RPC has its rows in one table."""

from __future__ import annotations

import grpc
import yaml

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
from meshrl.common.grpc_server import ServerConfig, Service, start_server
from meshrl.scheduler.job_permissions import JobPermissions
from meshrl.scheduler.job_policy import JobPolicy
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.server import SchedulerServicer
from meshrl.scheduler.workflow import builtin_workflow_text

BAD, MISSING, DENIED, STATE = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
)


def _config(tmp_path, **sections) -> str:
    cfg = {
        "job": {"name": "p"},
        "model": {"path": str(tmp_path / "model")},
        "data": {"train": str(tmp_path / "train.jsonl")},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return yaml.safe_dump(cfg)


def _cases(tmp_path) -> list[tuple]:
    good = _config(tmp_path)

    def submit(**fields) -> spb.SubmitJobRequest:
        return spb.SubmitJobRequest(**{"workflow_name": "grpo", "config_yaml": good, **fields})

    return [
        ("SubmitJob", submit(workflow_yaml="dag_id: x\nnodes: []\n"), BAD, "exactly one of"),
        ("SubmitJob", spb.SubmitJobRequest(config_yaml=good), BAD, "exactly one of"),
        ("SubmitJob", submit(workflow_name="grpoo"), MISSING, "did you mean 'grpo'"),
        ("SubmitJob", submit(job_id="../escape"), BAD, "../escape"),
        ("SubmitJob", submit(config_yaml=_config(tmp_path, rollout={"n": 0})), BAD, "rollout.n"),
        ("SubmitJob", submit(config_yaml=_config(tmp_path, rollout={"nn": 2})), BAD, "nn"),
        ("SubmitJob", submit(config_yaml="job: [unclosed"), BAD, "YAML"),
        ("SubmitJob", submit(overrides=["rollout.n"]), BAD, "rollout.n"),
        ("SubmitJob", submit(overrides=["job.steps=-1"]), BAD, "job.steps"),
        ("SubmitJob", submit(workflow_name="", workflow_yaml="nodes: {a: 1}\n"), BAD, "nodes"),
        ("SubmitJob", submit(resume_run_dir=str(tmp_path / "runs" / "none")), MISSING, "none"),
        ("SubmitJob", submit(resume_run_dir="/etc"), DENIED, "/etc"),
        ("SubmitJob", submit(config_yaml=_config(tmp_path, job={"allowed_modules": ["os"]})), DENIED, "os"),
        (
            "SubmitJob",
            submit(config_yaml=_config(tmp_path, services={"ray_address": "127.0.0.9:6379"})),
            DENIED,
            "job_permissions.ray_addresses",
        ),
        ("SubmitJob", submit(job_id="held"), BAD, "job id 'held' is taken"),
        ("CancelJob", spb.CancelJobRequest(job_id="nobody"), MISSING, "nobody"),
        ("ScaleService", spb.ScaleServiceRequest(job_id="held", service="trainer", replicas=2), BAD, "trainer"),
        ("ScaleService", spb.ScaleServiceRequest(job_id="held", service="rollout", replicas=0), BAD, "replicas = 0"),
        ("ScaleService", spb.ScaleServiceRequest(job_id="held", service="rollout", replicas=-4), BAD, "replicas = -4"),
        ("ScaleService", spb.ScaleServiceRequest(job_id="nobody", service="rollout", replicas=2), MISSING, "nobody"),
        ("ScaleService", spb.ScaleServiceRequest(job_id="held", service="rollout", replicas=2), STATE, "not running"),
    ]


def _state(stub, root) -> tuple:
    jobs = stub.ListJobs(spb.ListJobsRequest(), timeout=10)
    listed = sorted((j.job_id, j.state) for j in jobs.jobs)
    return listed, sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_every_mutating_scheduler_rpc_refuses_bad_input_and_changes_nothing(tmp_path):
    readable = JobPermissions(read_roots=[str(tmp_path)])  # the model and data the configs name
    jobs = JobManager(policy=JobPolicy.operator(["meshrl"], tmp_path / "runs", readable))
    jobs.create(builtin_workflow_text("grpo"), _config(tmp_path), [], job_id="held")  # pending: never started
    service = Service(scheduler_pb2_grpc.add_SchedulerServicer_to_server, SchedulerServicer(jobs), "s")
    running = start_server(ServerConfig(port=0), [service])
    wrong = []
    try:
        with grpc.insecure_channel(running.address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            for method, request, code, text in _cases(tmp_path):
                before = _state(stub, tmp_path)
                try:
                    getattr(stub, method)(request, timeout=30)
                    outcome = None, ""
                except grpc.RpcError as exc:
                    outcome = exc.code(), exc.details()
                kept = _state(stub, tmp_path) == before
                if outcome[0] != code or text not in outcome[1] or not kept:
                    wrong.append(f"{method} {str(request)[:90]!r}: got {outcome}, state kept: {kept}")
    finally:
        running.stop(0)
    assert not wrong, "\n".join(wrong)
