"""Each job belongs to its submitter: over the real job API, with two submitters' tokens (and with two client
certificates), one submitter cannot get, watch, cancel, scale or resume the other's job (PERMISSION_DENIED
naming both and the setting), lists only its own jobs, and acts on its own; the operator's token acts on every
job. A job's owner is recorded in its run folder; the submitters' settings are checked at start."""

from __future__ import annotations

import grpc
import pydantic
import pytest
import yaml

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
from meshrl.common.errors import ConfigError, PermissionDenied
from meshrl.common.grpc_server import ServerConfig, Service, start_server
from meshrl.common.security import AuthConfig, TLSConfig, channel_credentials, token_client_interceptor
from meshrl.scheduler.job_access import OWNER_FILE, JobAccess, recorded_owner
from meshrl.scheduler.job_permissions import JobPermissions
from meshrl.scheduler.job_policy import JobPolicy
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.server import SchedulerServicer
from meshrl.scheduler.workflow import builtin_workflow_text
from tests.unit.common._certs import CA

GRPO = builtin_workflow_text("grpo")
DENIED = grpc.StatusCode.PERMISSION_DENIED


def _config(tmp_path) -> str:
    """A job that ends at once when run (its model folder does not exist), without starting any service."""
    return yaml.safe_dump(
        {
            "job": {"name": "f", "max_restarts": 0},
            "model": {"path": str(tmp_path / "none")},
            "data": {"train": str(tmp_path / "t.jsonl")},
        }
    )


def _token(tmp_path, name: str) -> str:
    path = tmp_path / f"{name}.token"
    path.write_text(f"secret-of-{name}\n")
    return str(path)


@pytest.fixture()
def api(tmp_path):
    """A token-secured scheduler with submitters alice and bob; stubs per identity, and the JobManager."""
    access = JobAccess(submitters={n: {"token_file": _token(tmp_path, n)} for n in ("alice", "bob")})
    server_cfg = ServerConfig(port=0, auth=AuthConfig(token_file=_token(tmp_path, "operator")))
    jobs = JobManager(run_root=str(tmp_path / "runs"))
    servicer = SchedulerServicer(jobs, access.callers(server_cfg.auth.token(), client_certificates=False))
    service = Service(scheduler_pb2_grpc.add_SchedulerServicer_to_server, servicer, "s")
    running = start_server(server_cfg, [service], tokens=list(access.tokens().values()))
    channels = {
        who: grpc.intercept_channel(
            grpc.insecure_channel(running.address), token_client_interceptor(f"secret-of-{who}")
        )
        for who in ("alice", "bob", "operator")
    }
    yield {who: scheduler_pb2_grpc.SchedulerStub(ch) for who, ch in channels.items()}, jobs, servicer
    for channel in channels.values():
        channel.close()
    running.stop(0)


def _denied(call, *texts: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == DENIED, info.value.details()
    for text in texts:
        assert text in info.value.details(), info.value.details()


def test_one_submitter_cannot_act_on_anothers_job(api, tmp_path):
    stubs, jobs, _ = api
    submitted = stubs["alice"].SubmitJob(
        spb.SubmitJobRequest(workflow_name="grpo", config_yaml=_config(tmp_path), job_id="a1"), timeout=30
    )
    assert recorded_owner(tmp_path / "runs" / "a1") == "alice" == jobs.jobs["a1"].owner
    bob = stubs["bob"]
    _denied(
        lambda: bob.GetJob(spb.GetJobRequest(job_id="a1"), timeout=10),
        "'bob' may not read job 'a1'",
        "submitted by 'alice'",
        "job_access.admins",
    )
    _denied(lambda: next(bob.WatchJob(spb.WatchJobRequest(job_id="a1"), timeout=10)), "may not watch")
    _denied(lambda: bob.CancelJob(spb.CancelJobRequest(job_id="a1"), timeout=10), "may not cancel")
    scale = spb.ScaleServiceRequest(job_id="a1", service="rollout", replicas=2)
    _denied(lambda: bob.ScaleService(scale, timeout=10), "may not scale")
    assert [j.job_id for j in bob.ListJobs(spb.ListJobsRequest(), timeout=10).jobs] == []
    alice = stubs["alice"]
    assert alice.GetJob(spb.GetJobRequest(job_id="a1"), timeout=10).job_id == submitted.job_id
    assert [e.sequence for e in alice.WatchJob(spb.WatchJobRequest(job_id="a1"), timeout=30)]  # to its end
    assert [j.job_id for j in alice.ListJobs(spb.ListJobsRequest(), timeout=10).jobs] == ["a1"]


def test_the_operator_acts_on_every_job_and_owners_act_on_their_own(api, tmp_path):
    stubs, jobs, servicer = api
    for who, job_id in (("alice", "a2"), ("bob", "b2")):  # pending: never started
        jobs.create(GRPO, _config(tmp_path), [], job_id=job_id, caller=servicer.callers.caller(who))
    listed = stubs["operator"].ListJobs(spb.ListJobsRequest(), timeout=10).jobs
    assert sorted(j.job_id for j in listed) == ["a2", "b2"]
    assert stubs["operator"].GetJob(spb.GetJobRequest(job_id="b2"), timeout=10).job_id == "b2"
    scale = spb.ScaleServiceRequest(job_id="b2", service="rollout", replicas=2)
    with pytest.raises(grpc.RpcError) as info:  # past the permission check: the job is not running
        stubs["bob"].ScaleService(scale, timeout=10)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, info.value.details()
    stubs["bob"].CancelJob(spb.CancelJobRequest(job_id="b2"), timeout=10)
    assert jobs.jobs["b2"].runner.cancelled.is_set()
    stubs["operator"].CancelJob(spb.CancelJobRequest(job_id="a2"), timeout=10)
    assert jobs.jobs["a2"].runner.cancelled.is_set()


def test_only_the_submitter_or_an_admin_resumes_a_run(api, tmp_path):
    stubs, jobs, servicer = api
    ended = jobs.create(GRPO, _config(tmp_path), [], job_id="a3", caller=servicer.callers.caller("alice"))
    jobs.run(ended)
    folder = str(ended.runner.run.root)
    resume = spb.SubmitJobRequest(workflow_name="grpo", config_yaml=_config(tmp_path), resume_run_dir=folder)
    _denied(lambda: stubs["bob"].SubmitJob(resume, timeout=30), "'bob' may not resume the run in", "'alice'")
    assert sorted(jobs.jobs) == ["a3"]
    bob = servicer.callers.caller("bob")
    with pytest.raises(PermissionDenied, match="may not resume"):
        jobs.create(GRPO, _config(tmp_path), [], job_id="b3", resume_dir=folder, caller=bob)
    again = jobs.create(
        GRPO, _config(tmp_path), [], job_id="a4", resume_dir=folder, caller=servicer.callers.caller("alice")
    )
    assert again.owner == "alice"
    unrecorded = tmp_path / "runs" / "a3" / OWNER_FILE
    unrecorded.unlink()  # a run folder from before owners were recorded: only admins resume it
    jobs.run(again)
    with pytest.raises(PermissionDenied, match="unrecorded submitter"):
        jobs.create(
            GRPO, _config(tmp_path), [], job_id="a5", resume_dir=folder, caller=servicer.callers.caller("alice")
        )
    operator = jobs.create(
        GRPO, _config(tmp_path), [], job_id="o5", resume_dir=folder, caller=servicer.callers.caller("operator")
    )
    assert operator.owner == "operator" == recorded_owner(folder)


def test_client_certificates_are_identities(tmp_path):
    ca = CA(tmp_path, "ca")
    cert, key = ca.issue("localhost")
    tls = TLSConfig(cert_file=cert, key_file=key, ca_file=ca.cert_file)
    access = JobAccess(admins=["cert:ops"])
    jobs = JobManager(run_root=str(tmp_path / "runs"))
    servicer = SchedulerServicer(jobs, access.callers(None, client_certificates=True))
    service = Service(scheduler_pb2_grpc.add_SchedulerServicer_to_server, servicer, "s")
    running = start_server(ServerConfig(port=0, tls=tls), [service])
    stubs, channels = {}, []
    for who in ("carol", "dave", "ops"):
        c, k = ca.issue(who)
        creds = channel_credentials(TLSConfig(cert_file=c, key_file=k, ca_file=ca.cert_file))
        channels.append(grpc.secure_channel(f"localhost:{running.port}", creds))
        stubs[who] = scheduler_pb2_grpc.SchedulerStub(channels[-1])
    try:
        request = spb.SubmitJobRequest(workflow_name="grpo", config_yaml=_config(tmp_path), job_id="c1")
        stubs["carol"].SubmitJob(request, timeout=30)
        assert jobs.jobs["c1"].owner == "cert:carol"
        _denied(
            lambda: stubs["dave"].CancelJob(spb.CancelJobRequest(job_id="c1"), timeout=10),
            "'cert:dave' may not cancel job 'c1'",
            "'cert:carol'",
        )
        assert stubs["ops"].GetJob(spb.GetJobRequest(job_id="c1"), timeout=10).job_id == "c1"
        assert stubs["carol"].GetJob(spb.GetJobRequest(job_id="c1"), timeout=10).job_id == "c1"
    finally:
        for channel in channels:
            channel.close()
        running.stop(0)


def test_a_scheduler_without_authentication_lets_every_caller_act(tmp_path):
    jobs = JobManager(run_root=str(tmp_path / "runs"))
    service = Service(scheduler_pb2_grpc.add_SchedulerServicer_to_server, SchedulerServicer(jobs), "s")
    running = start_server(ServerConfig(port=0), [service])
    channel = grpc.insecure_channel(running.address)
    try:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        stub.SubmitJob(spb.SubmitJobRequest(workflow_name="grpo", config_yaml=_config(tmp_path), job_id="o1"))
        assert jobs.jobs["o1"].owner == "anonymous"
        assert stub.GetJob(spb.GetJobRequest(job_id="o1"), timeout=10).job_id == "o1"
    finally:
        channel.close()
        running.stop(0)


def test_submitter_settings_are_checked(tmp_path, monkeypatch):
    with pytest.raises(pydantic.ValidationError, match="exactly one of token_file and token_env"):
        JobAccess(submitters={"alice": {}})
    with pytest.raises(pydantic.ValidationError, match="exactly one of token_file and token_env"):
        JobAccess(submitters={"alice": {"token_file": "f", "token_env": "E"}})
    for bad in ("operator", "anonymous", "cert:x", "-a", ""):
        with pytest.raises(pydantic.ValidationError, match="choose another name"):
            JobAccess(submitters={bad: {"token_env": "E"}})
    with pytest.raises(ConfigError, match="job_access.submitters.alice.token_file.*does not exist"):
        JobAccess(submitters={"alice": {"token_file": str(tmp_path / "missing")}}).tokens()
    monkeypatch.delenv("ALICE_TOKEN", raising=False)
    with pytest.raises(ConfigError, match=r"job_access.submitters.alice.*\$ALICE_TOKEN.*empty or unset"):
        JobAccess(submitters={"alice": {"token_env": "ALICE_TOKEN"}}).tokens()
    monkeypatch.setenv("ALICE_TOKEN", "same")
    monkeypatch.setenv("BOB_TOKEN", "same")
    twins = JobAccess(submitters={"alice": {"token_env": "ALICE_TOKEN"}, "bob": {"token_env": "BOB_TOKEN"}})
    with pytest.raises(ConfigError, match="same token as submitter 'alice'"):
        twins.tokens()
    alone = JobAccess(submitters={"alice": {"token_env": "ALICE_TOKEN"}})
    with pytest.raises(ConfigError, match="server.auth's token"):
        alone.callers("same", client_certificates=False)


def test_the_scheduler_service_admits_its_submitters_tokens(tmp_path):
    """`python -m meshrl.scheduler` with job_access.submitters: each submitter's token is admitted and names it;
    another token is refused UNAUTHENTICATED."""
    import subprocess
    import sys
    import time

    port_file = tmp_path / "port"
    config = {
        "server": {"port": 0, "port_file": str(port_file), "auth": {"token_file": _token(tmp_path, "operator")}},
        "run_root": str(tmp_path / "runs"),
        "recover_jobs": False,
        "job_permissions": {"read_roots": [str(tmp_path)]},
        "job_access": {"submitters": {"alice": {"token_file": _token(tmp_path, "alice")}}},
    }
    (tmp_path / "scheduler.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-m", "meshrl.scheduler", "--config", str(tmp_path / "scheduler.yaml")])
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.1)
        address = f"127.0.0.1:{port_file.read_text()}"
        request = spb.SubmitJobRequest(workflow_name="grpo", config_yaml=_config(tmp_path), job_id="s1")
        for token, code in (("secret-of-alice", None), ("secret-of-mallory", grpc.StatusCode.UNAUTHENTICATED)):
            channel = grpc.intercept_channel(grpc.insecure_channel(address), token_client_interceptor(token))
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            try:
                if code is None:
                    stub.SubmitJob(request, timeout=30)
                else:
                    with pytest.raises(grpc.RpcError) as info:
                        stub.ListJobs(spb.ListJobsRequest(), timeout=10)
                    assert info.value.code() == code, info.value.details()
            finally:
                channel.close()
        assert recorded_owner(tmp_path / "runs" / "s1") == "alice"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_new_run_cannot_take_another_submitters_folder(tmp_path):
    policy = JobPolicy.operator(["meshrl"], tmp_path / "runs", JobPermissions(read_roots=[str(tmp_path)]))
    jobs = JobManager(policy=policy, keep_finished=0)  # the scheduler service's policy
    access = JobAccess()
    callers = access.callers(None, client_certificates=True)  # identities from certificates
    alice, bob = callers.caller("cert:alice"), callers.caller("cert:bob")
    ended = jobs.create(GRPO, _config(tmp_path), [], job_id="a6", caller=alice)
    jobs.run(ended)
    assert "a6" not in jobs.jobs  # forgotten; its folder stays
    with pytest.raises(PermissionDenied, match="'cert:bob' may not write into the run folder .*a6"):
        jobs.create(GRPO, _config(tmp_path), [], job_id="a6", caller=bob)
    nested = yaml.safe_load(_config(tmp_path))
    nested["job"]["run_root"] = "a6"  # a folder inside alice's run
    with pytest.raises(PermissionDenied, match="may not write into the run folder"):
        jobs.create(GRPO, yaml.safe_dump(nested), [], job_id="b6", caller=bob)
    assert recorded_owner(tmp_path / "runs" / "a6") == "cert:alice"
    again = jobs.create(GRPO, _config(tmp_path), [], job_id="a6", caller=alice)  # its submitter may
    assert again.owner == "cert:alice"
