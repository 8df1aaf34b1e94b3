"""The scheduler's job policy: the operator's allow-list (a job may only narrow it, refs checked by name before
any import), run ids and run / resume folders inside the run root, and `meshrl run`'s local convenience.
Refused submissions leave nothing behind: no module imported, no run folder, no job record."""

from __future__ import annotations

import sys
import textwrap

import grpc
import pytest
import yaml

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.api.scheduler.v1 import scheduler_pb2_grpc
from meshrl.common.errors import InvalidArgument, NotFound, PermissionDenied
from meshrl.common.grpc_server import ServerConfig, Service, start_server
from meshrl.scheduler.job_permissions import JobPermissions
from meshrl.scheduler.job_policy import JobPolicy
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.server import SchedulerServicer
from meshrl.scheduler.workflow import builtin_workflow_text


@pytest.fixture
def evil_module(tmp_path, monkeypatch):
    """A module whose import leaves a marker file (its top-level code ran)."""
    name = f"mrl_evil_{tmp_path.name.replace('-', '_')}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(f"""
        import pathlib
        pathlib.Path({str(marker)!r}).write_text("ran")

        def score(prompts, responses, answers):
            return [0.0] * len(responses)
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    sys.modules.pop(name, None)


def _config(tmp_path, **job) -> str:
    cfg = {
        "job": {"name": "p", **job},
        "model": {"path": str(tmp_path / "model")},
        "data": {"train": str(tmp_path / "train.jsonl")},
    }
    return yaml.safe_dump(cfg)


def _reward_config(tmp_path, reward: str, **job) -> str:
    data = yaml.safe_load(_config(tmp_path, **job))
    data["algorithm"] = {"reward": reward}
    return yaml.safe_dump(data)


def _manager(tmp_path, allowed=("meshrl",)) -> JobManager:
    readable = JobPermissions(read_roots=[str(tmp_path)])  # the model and data the configs name
    return JobManager(policy=JobPolicy.operator(list(allowed), tmp_path / "runs", readable))


def _workflow_with_ref(ref: str) -> str:
    data = yaml.safe_load(builtin_workflow_text("grpo"))
    for node in data["nodes"]:
        if node.get("node_role") == "REWARD":
            node["executable_ref"] = ref
    return yaml.safe_dump(data)


def _nothing_left(jobs: JobManager, tmp_path, marker) -> None:
    assert not marker.exists(), "the refused module was imported"
    assert jobs.jobs == {}
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []


def test_a_job_cannot_widen_the_operators_allow_list(tmp_path, evil_module):
    name, marker = evil_module
    jobs = _manager(tmp_path)
    with pytest.raises(PermissionDenied) as info:
        jobs.create(_workflow_with_ref(f"{name}:score"), _config(tmp_path, allowed_modules=["meshrl", name]), [])
    assert "job.allowed_modules" in str(info.value) and name in str(info.value)
    _nothing_left(jobs, tmp_path, marker)
    with pytest.raises(PermissionDenied):
        jobs.create(builtin_workflow_text("grpo"), _config(tmp_path, allowed_modules=["*"]), [])


def test_a_ref_outside_the_operators_list_is_refused_by_name(tmp_path, evil_module):
    name, marker = evil_module
    jobs = _manager(tmp_path)
    with pytest.raises(InvalidArgument) as info:  # the workflow's executable_ref
        jobs.create(_workflow_with_ref(f"{name}:score"), _config(tmp_path), [])
    assert "outside the allowed modules" in str(info.value)
    with pytest.raises(PermissionDenied):  # the job's reward, checked at submit, not when the job runs
        jobs.create(builtin_workflow_text("grpo"), _reward_config(tmp_path, f"{name}:score"), [])
    _nothing_left(jobs, tmp_path, marker)


def test_a_job_may_narrow_the_list_and_inherits_it_otherwise(tmp_path, evil_module):
    name, marker = evil_module
    jobs = _manager(tmp_path, allowed=("meshrl", name))
    record = jobs.create(builtin_workflow_text("grpo"), _config(tmp_path), [])
    assert record.runner.cfg.job.allowed_modules == ["meshrl", name]
    narrowed = jobs.create(builtin_workflow_text("grpo"), _config(tmp_path, allowed_modules=["meshrl.scheduler"]), [])
    assert narrowed.runner.cfg.job.allowed_modules == ["meshrl.scheduler"]
    with pytest.raises(PermissionDenied):  # the narrowed list no longer allows the operator's other module
        jobs.create(
            builtin_workflow_text("grpo"), _reward_config(tmp_path, f"{name}:score", allowed_modules=["meshrl"]), []
        )
    assert not marker.exists()


def test_local_run_keeps_the_jobs_own_list(tmp_path, evil_module):
    name, marker = evil_module
    jobs = JobManager(run_root=str(tmp_path / "runs"))
    record = jobs.create(_workflow_with_ref(f"{name}:score"), _config(tmp_path, allowed_modules=["meshrl", name]), [])
    assert marker.exists() and record.runner.cfg.job.allowed_modules == ["meshrl", name]


@pytest.mark.parametrize("job_id", ["../escape", "a/b", "..", "/abs", "x" * 200, "with space"])
def test_run_ids_that_name_another_folder_are_refused(tmp_path, job_id):
    jobs = _manager(tmp_path)
    with pytest.raises(InvalidArgument) as info:
        jobs.create(builtin_workflow_text("grpo"), _config(tmp_path), [], job_id=job_id)
    assert info.value.field == "job_id"
    assert not (tmp_path / "escape").exists() and jobs.jobs == {}


def test_run_root_of_a_submitted_job_stays_inside_the_operators(tmp_path):
    jobs = _manager(tmp_path)
    with pytest.raises(PermissionDenied) as info:
        jobs.create(builtin_workflow_text("grpo"), _config(tmp_path, run_root=str(tmp_path / "elsewhere")), [])
    assert "job.run_root" in str(info.value)
    assert not (tmp_path / "elsewhere").exists()
    record = jobs.create(builtin_workflow_text("grpo"), _config(tmp_path, run_root="team-a"), [], job_id="r1")
    assert record.runner.run.root == (tmp_path / "runs" / "team-a" / "r1").resolve()


def test_resume_folder_must_exist_and_lie_inside_the_run_root(tmp_path):
    jobs = _manager(tmp_path)
    with pytest.raises(NotFound):
        jobs.create(builtin_workflow_text("grpo"), _config(tmp_path), [], resume_dir=str(tmp_path / "runs" / "nope"))
    assert not (tmp_path / "runs" / "nope").exists()
    with pytest.raises(PermissionDenied):
        jobs.create(builtin_workflow_text("grpo"), _config(tmp_path), [], resume_dir=str(tmp_path))
    local = JobManager(run_root=str(tmp_path / "runs"))
    with pytest.raises(NotFound):  # even locally a typo is not a fresh run folder
        local.create(builtin_workflow_text("grpo"), _config(tmp_path), [], resume_dir=str(tmp_path / "typo"))
    assert not (tmp_path / "typo").exists()
    first = jobs.create(builtin_workflow_text("grpo"), _config(tmp_path), [], job_id="r2")
    again = JobManager(policy=jobs.policy).create(
        builtin_workflow_text("grpo"), _config(tmp_path), [], resume_dir=str(first.runner.run.root)
    )
    assert again.job_id == "r2" and again.resume


def test_submit_job_over_grpc_maps_a_widening_job_to_permission_denied(tmp_path, evil_module):
    name, marker = evil_module
    jobs = _manager(tmp_path)
    service = Service(scheduler_pb2_grpc.add_SchedulerServicer_to_server, SchedulerServicer(jobs), "s")
    running = start_server(ServerConfig(port=0), [service])
    try:
        with grpc.insecure_channel(running.address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            request = spb.SubmitJobRequest(
                workflow_name="grpo", config_yaml=_config(tmp_path, allowed_modules=["os"]), job_id="x"
            )
            with pytest.raises(grpc.RpcError) as info:
                stub.SubmitJob(request, timeout=30)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        running.stop(0)
    _nothing_left(jobs, tmp_path, marker)


def _laughs_in_a_node_config() -> str:
    data = yaml.safe_load(builtin_workflow_text("grpo"))
    text = yaml.safe_dump(data, sort_keys=False)
    anchors = '  x-l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for i in range(1, 9):
        anchors += f"  x-l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n"
    # a free-form `config` field of the first node holds the bomb
    return "x-bomb:\n" + anchors + text.replace("  node_type:", "  config: {bomb: *l8}\n  node_type:", 1)


def test_alias_bombs_in_a_workflow_and_a_job_config_are_refused_fast(tmp_path):
    import time

    jobs = _manager(tmp_path)
    start = time.monotonic()
    with pytest.raises(InvalidArgument) as info:
        jobs.create(_laughs_in_a_node_config(), _config(tmp_path), [])
    assert "alias" in str(info.value) or "expands" in str(info.value)
    bomb_config = (
        _config(tmp_path)
        + "x: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
        + "".join(f"y{i}: &b{i} [{', '.join(['*a' if i == 0 else f'*b{i - 1}'] * 9)}]\n" for i in range(9))
    )
    with pytest.raises(InvalidArgument):
        jobs.create(builtin_workflow_text("grpo"), bomb_config, [])
    assert time.monotonic() - start < 5.0 and jobs.jobs == {}


def test_config_references_cannot_multiply_a_large_value(tmp_path):
    data = yaml.safe_load(builtin_workflow_text("grpo"))
    data["nodes"][0]["config"] = {f"k{i}": "${config.data.system_prompt}" for i in range(2000)}
    config = yaml.safe_load(_config(tmp_path))
    config["data"]["system_prompt"] = "p" * 100_000  # 2000 copies would be 200 MB
    jobs = _manager(tmp_path)
    with pytest.raises(InvalidArgument, match="references copy more than"):
        jobs.create(yaml.safe_dump(data), yaml.safe_dump(config), [])


@pytest.mark.parametrize(
    "override",
    ["engine.sglang.python=/bin/sh", "engine.vllm.env.LD_PRELOAD=/tmp/x.so", "paths.roots=[/]", "weights.path=/etc"],
)
def test_a_submitted_job_cannot_override_what_launched_services_run_or_read(tmp_path, override):
    data = yaml.safe_load(_config(tmp_path))
    data["rollout"] = {"service_overrides": [override]}
    jobs = _manager(tmp_path)
    with pytest.raises(PermissionDenied, match="may not change"):
        jobs.create(builtin_workflow_text("grpo"), yaml.safe_dump(data), [])
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    data["rollout"] = {"service_overrides": ["engine.sglang.extra_args.mem_fraction_static=0.7"]}
    jobs.create(builtin_workflow_text("grpo"), yaml.safe_dump(data), [], job_id="tuned")  # tuning is allowed
