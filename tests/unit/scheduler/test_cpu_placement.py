"""services.cpu_placement: the trainer and the replicas a job launches get disjoint cores of this host (by
shares or by name), the config refuses sets that overlap or cannot be honoured, a placed spec carries its cores
and matching thread counts, a launched process runs on its cores only, the rest of the job (data buffer, the
job's thread and what it starts) goes on the cores `others` names, and `meshrl plan` shows the sets."""

from __future__ import annotations

import io
import os
import threading

import pytest

from meshrl.common.config import load_config
from meshrl.common.errors import ConfigError
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.config.cpu_placement import CpuPlacement
from meshrl.scheduler.launch.cpu_placement import (
    CPU_CORES_ENV,
    CpuSets,
    cpu_sets,
    host_cores,
    parse_cores,
    pin_thread,
    placed,
    unpin_thread,
)
from meshrl.scheduler.launch.launcher import ServiceSpec
from meshrl.scheduler.launch.process import ServiceProcess
from meshrl.scheduler.launch.services import rollout_spec, trainer_spec
from meshrl.scheduler.planning.plan_cli import plan_main
from meshrl.scheduler.rundir import RunDir


def job(*overrides: str) -> JobConfig:
    return load_config(JobConfig, env={}, overrides=["model.path=m", "data.train=t.jsonl", *overrides])


def test_shares_split_the_host_in_their_proportions():
    assert cpu_sets(CpuPlacement(), 1, [0, 1]) == CpuSets((0,), ((1,),), others=(1,))
    sets = cpu_sets(CpuPlacement(trainer_share=3, rollout_share=1), 2, list(range(8)))
    assert sets.trainer == (0, 1, 2, 3, 4, 5) and sets.replicas == ((6,), (7,))
    # each side keeps at least one core, whatever the proportions
    assert cpu_sets(CpuPlacement(trainer_share=100, rollout_share=1), 1, [0, 1, 2, 3]).replicas == ((3,),)
    assert cpu_sets(CpuPlacement(trainer_share=1, rollout_share=100), 1, [0, 1, 2, 3]).trainer == (0,)
    # more replicas than rollout cores: they share the rollout cores, never the trainer's
    sets = cpu_sets(CpuPlacement(), 3, [4, 5, 6, 7])
    assert sets.trainer == (4, 5) and sets.replicas == ((6, 7),) * 3


def test_named_cores_are_used_as_given_and_must_exist_here():
    sets = cpu_sets(CpuPlacement(trainer_cores=[2, 0], rollout_cores=[1, 3]), 2, [0, 1, 2, 3])
    assert sets == CpuSets((0, 2), ((1,), (3,)), others=(1, 3))
    with pytest.raises(ConfigError, match=r"rollout_cores.*cores \[9\] are not cores this host lets the job use"):
        cpu_sets(CpuPlacement(trainer_cores=[0], rollout_cores=[9]), 1, [0, 1])
    with pytest.raises(ConfigError, match="nothing to split"):
        cpu_sets(CpuPlacement(), 1, [0])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"trainer_cores": [0, 1], "rollout_cores": [1]}, r"cores \[1\] are in both"),
        ({"trainer_cores": [0]}, "names the cores of one side only"),
        ({"trainer_cores": [0], "rollout_cores": [1], "trainer_share": 2}, "gives both shares and core lists"),
        ({"trainer_cores": [], "rollout_cores": [1]}, "trainer_cores is empty"),
        ({"trainer_cores": [0, 0], "rollout_cores": [1]}, "distinct numbers >= 0"),
        ({"trainer_cores": [0], "rollout_cores": [-1]}, "distinct numbers >= 0"),
        ({"trainer_share": 0}, "greater than 0"),
    ],
)
def test_bad_placements_are_refused_when_the_job_loads(fields, message):
    overrides = [f"services.cpu_placement.{k}={v}" for k, v in fields.items()]
    with pytest.raises(ConfigError, match=message):
        job(*overrides)


def test_placement_needs_separate_services_this_host_launches():
    with pytest.raises(ConfigError, match="placement = 'colocated'"):
        job("services.cpu_placement.trainer_share=1", "services.placement=colocated")
    with pytest.raises(ConfigError, match="ray_address"):
        job("services.cpu_placement.trainer_share=1", "services.ray_address=10.0.0.1:6379")
    with pytest.raises(ConfigError, match="trainer.launch = 'group'"):
        job("services.cpu_placement.trainer_share=1", "trainer.launch=group", "services.placement=disaggregated")


def test_a_placed_spec_carries_its_cores_and_thread_counts(tmp_path):
    cfg = job("services.cpu_placement.trainer_share=3", "training.mode=one_step_off")
    sets = CpuSets((0, 1, 2), ((3,),))
    trainer = placed(trainer_spec(cfg, RunDir(tmp_path), "trainer", "127.0.0.1:1", "m"), sets)
    assert trainer.env[CPU_CORES_ENV] == "0,1,2" and trainer.env["OMP_NUM_THREADS"] == "3"
    threads = [v for k, v in zip(trainer.args, trainer.args[1:]) if k == "--set" and "torch_threads" in v]
    assert threads == ["torch_threads=3"]  # training.split_threads gives way to the placement
    assert placed(trainer_spec(cfg, RunDir(tmp_path), "trainer", "a", "m"), sets, trainer_ranks=2).args[1] == (
        "torch_threads=1"
    )
    replica = placed(rollout_spec(cfg, RunDir(tmp_path), "rollout-0", "127.0.0.1:1", "m"), sets)
    assert replica.env[CPU_CORES_ENV] == "3" and replica.args[:2] == ["--set", "engine.transformers.num_threads=1"]
    vllm = placed(rollout_spec(cfg, RunDir(tmp_path), "rollout-0", "a", "m"), sets, engine="vllm")
    assert vllm.env[CPU_CORES_ENV] == "3" and "engine.transformers.num_threads=1" not in vllm.args
    buffer = ServiceSpec("databuffer", "databuffer", ["--set", "x=1"])
    assert placed(buffer, sets) is buffer  # `others: any`
    on_rollout = placed(buffer, CpuSets((0, 1, 2), ((3,),), others=(3,)))
    assert on_rollout.env[CPU_CORES_ENV] == "3" and on_rollout.args == ["--set", "x=1"]  # no torch settings


@pytest.mark.parametrize(("others", "cores"), [("rollout", (2, 3)), ("trainer", (0, 1)), ("any", None)])
def test_the_rest_of_the_job_goes_where_others_says(others, cores):
    sets = cpu_sets(CpuPlacement(others=others), 2, [0, 1, 2, 3])
    assert sets.others == cores and sets.of("databuffer") == cores
    assert sets.as_dict()["others"] == (list(cores) if cores else None)
    with pytest.raises(ConfigError, match="Input should be 'rollout', 'trainer' or 'any'"):
        job("services.cpu_placement.others=elsewhere")


def test_a_pinned_thread_and_what_it_starts_stay_on_its_cores_until_unpinned():
    core, seen = host_cores()[-1], {}

    def job_thread():
        before = pin_thread((core,))
        child = threading.Thread(target=lambda: seen.setdefault("child", os.sched_getaffinity(0)))
        child.start()
        child.join()
        seen["pinned"] = os.sched_getaffinity(0)
        unpin_thread(before)
        seen["after"] = os.sched_getaffinity(0)

    main = os.sched_getaffinity(0)
    worker = threading.Thread(target=job_thread)
    worker.start()
    worker.join()
    assert seen == {"child": {core}, "pinned": {core}, "after": main}
    assert os.sched_getaffinity(0) == main  # the pin was the job thread's alone, never the process's
    assert pin_thread(None) is None


def test_parse_cores_names_a_bad_value():
    assert parse_cores("0, 2") == {0, 2}
    with pytest.raises(ConfigError, match="comma-separated"):
        parse_cores("0-2")


def test_a_launched_process_runs_on_its_cores_only(tmp_path):
    core = host_cores()[-1]
    proc = ServiceProcess(
        "databuffer",
        ["--set", "redis.url=redis://127.0.0.1:1"],
        str(tmp_path / "databuffer.log"),
        {CPU_CORES_ENV: str(core)},
        exit_with_parent=True,
    )
    proc.spawn()
    try:
        assert os.sched_getaffinity(proc.pid) == {core}
    finally:
        proc.stop(grace=5)


@pytest.mark.skipif(len(host_cores()) < 2, reason="a host with one core has nothing to split")
def test_meshrl_plan_shows_each_services_cores():
    out, err = io.StringIO(), io.StringIO()
    argv = ["grpo", "--cpus-per-node", "2", "--set", "services.cpu_placement.trainer_share=1"]
    assert plan_main(argv, stdout=out, stderr=err) == 0, err.getvalue()
    cores = host_cores()
    half = max(1, min(round(len(cores) / 2), len(cores) - 1))
    assert "CPU placement on this host" in out.getvalue()
    assert f"trainer     cores {cores[0]}" in out.getvalue()
    assert f"rollout-0   cores {cores[half]}" in out.getvalue()
    assert f"the rest    cores {cores[half]}" in out.getvalue()  # `others: rollout`, the default
    bad = [
        "grpo",
        "--set",
        "services.cpu_placement.trainer_cores=[0]",
        "--set",
        "services.cpu_placement.rollout_cores=[0]",
    ]
    assert plan_main(bad, stdout=io.StringIO(), stderr=err) == 2
    assert "are in both trainer_cores and rollout_cores" in err.getvalue()
