"""A trainer group's pieces without Ray: each rank's environment and args, the plan's workers of the trainer
ranks (`planning.launch_plan`), the job config that asks for a group, and a start that lost its rendezvous port
to another process starting again."""

from __future__ import annotations

import pytest

from meshrl.common.errors import ConfigError, InvalidArgument, Unavailable
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.launch.trainer_group import (
    RENDEZVOUS_TRIES,
    RendezvousPortTaken,
    TrainerGroup,
    group_args,
    local_ranks,
    rank_env,
    start_failure,
)
from meshrl.scheduler.launch.trainer_layout import apply_trainer_layout
from meshrl.scheduler.planning.apportion import ClusterSpec, PlanError, WorkerSlot
from meshrl.scheduler.planning.launch_plan import plan_for_run, replica_workers, trainer_model, trainer_workers
from meshrl.scheduler.planning.plan_cli import plan_main
from meshrl.scheduler.workflow import load_workflow


def test_local_rank_counts_lower_ranks_on_the_same_node():
    assert local_ranks(["10.0.0.2", "10.0.0.3", "10.0.0.2", "10.0.0.3"]) == [0, 0, 1, 1]
    assert local_ranks(["a"]) == [0]


def test_rank_env_is_what_the_environment_launcher_reads():
    from meshrl.trainer.launched import Launcher, launched_rank

    env = rank_env(1, 2, 0, ("127.0.0.3", 29500))
    assert env == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.3",
        "MASTER_PORT": "29500",
    }
    rank = launched_rank(Launcher.ENVIRONMENT, 2, env)
    assert (rank.rank, rank.world, rank.local_rank, rank.master_address, rank.master_port) == (
        1,
        2,
        0,
        "127.0.0.3",
        29500,
    )


def test_group_args_pick_the_environment_launcher_and_the_backend_by_device():
    assert group_args(["--set", "a=1"], 0.0)[-4:] == [
        "--set",
        "data_parallel.launcher=environment",
        "--set",
        "data_parallel.backend=gloo",
    ]
    assert group_args([], 1.0)[-1] == "data_parallel.backend=nccl"


@pytest.mark.parametrize("world,pins,workers", [(0, [], []), (2, [{}], None), (2, None, ["n0:0"])])
def test_a_group_needs_one_pin_and_one_worker_per_rank(tmp_path, world, pins, workers):
    with pytest.raises(InvalidArgument, match="one pin and one worker per rank"):
        TrainerGroup([], world, tmp_path, {"CPU": 1}, pins, workers)


def _grpo(tp: int = 1):
    workflow = load_workflow("grpo", {})
    apply_trainer_layout(workflow, JobConfig.model_validate(_job(tp)).trainer)
    return workflow


def _job(tp: int = 1, **trainer) -> dict:
    return {"model": {"path": "m"}, "data": {"train": "t.jsonl"}, "trainer": {"tensor_parallel": tp, **trainer}}


def test_trainer_ranks_take_the_actors_workers_in_rank_order():
    plan = plan_for_run(_grpo(tp=2), ClusterSpec(2, 4, "CPU"), "disaggregated")
    actor = trainer_model(plan)
    assert actor.key == "actor" and actor.tensor_parallel == 2
    assert trainer_workers(plan, 2) == actor.workers[:2]
    assert list(trainer_workers(plan, 2)) == sorted(trainer_workers(plan, 2))
    colocated = plan_for_run(_grpo(), ClusterSpec(2, 1, "CPU"), "colocated")
    assert trainer_workers(colocated, 2) == (WorkerSlot(0, 0, 0), WorkerSlot(1, 1, 0))  # one rank per node


def test_replicas_take_the_first_worker_of_each_planned_rollout_replica_in_turn():
    # GRPO on 2 x 4 CPUs, rollout engines of tensor parallel 2: the plan's rollout replicas are worker pairs
    workflow = load_workflow("grpo", {})
    for node in workflow.nodes:
        if node.node_id == "rollout":
            node.config["tensor_parallel_size"] = 2
    plan = plan_for_run(workflow, ClusterSpec(2, 4, "CPU"), "disaggregated")
    rollout = next(m for m in plan.models if m.key == "rollout")
    leaders = [rollout.workers[i * 2] for i in range(rollout.data_parallel)]
    assert rollout.unit == 2 and len(leaders) == rollout.data_parallel >= 1
    assert replica_workers(plan, 3) == tuple(leaders[i % len(leaders)] for i in range(3))
    assert not set(replica_workers(plan, 3)) & set(trainer_model(plan).workers)  # never on the trainer's workers


def test_a_workflow_without_rollout_pins_no_replica(tmp_path):
    (tmp_path / "wf.yaml").write_text(
        "dag_id: sft_only\nnodes:\n"
        "  - {node_id: data_load, node_type: DATA_LOAD, node_role: DATA}\n"
        "  - {node_id: train, node_type: MODEL_TRAIN, node_role: ACTOR, dependencies: [data_load]}\n"
    )
    plan = plan_for_run(load_workflow(str(tmp_path / "wf.yaml"), {}), ClusterSpec(1, 2, "CPU"), "disaggregated")
    assert replica_workers(plan, 2) == ()


def test_a_plan_with_fewer_trainer_workers_than_ranks_is_refused_naming_both():
    plan = plan_for_run(_grpo(), ClusterSpec(1, 3, "CPU"), "disaggregated")
    have = len(trainer_model(plan).workers)
    with pytest.raises(PlanError, match=f"gives model 'actor' {have} worker.*launched with 8 ranks"):
        trainer_workers(plan, 8)


def test_a_workflow_without_a_trainer_model_places_no_rank(tmp_path):
    (tmp_path / "wf.yaml").write_text(
        "dag_id: gen_only\nnodes:\n"
        "  - {node_id: data_load, node_type: DATA_LOAD, node_role: DATA}\n"
        "  - {node_id: rollout, node_type: ROLLOUT, node_role: ROLLOUT, dependencies: [data_load]}\n"
    )
    plan = plan_for_run(load_workflow(str(tmp_path / "wf.yaml"), {}), ClusterSpec(1, 2, "CPU"), "disaggregated")
    with pytest.raises(PlanError, match="no trainer model"):
        trainer_workers(plan, 1)


def test_meshrl_plan_prints_the_workers_a_run_gives_the_ranks(tmp_path, capsys):
    import json

    import yaml

    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tp=2)))
    args = ["grpo", "--nodes", "2", "--cpus-per-node", "4", "--placement", "disaggregated", "--json"]
    assert plan_main([*args, "--config", str(tmp_path / "job.yaml")]) == 0
    printed = json.loads(capsys.readouterr().out)
    actor = next(m for m in printed["models"] if m["key"] == "actor")
    planned = plan_for_run(_grpo(tp=2), ClusterSpec(2, 4, "CPU"), "disaggregated")
    assert actor["workers"][:2] == [w.index for w in trainer_workers(planned, 2)]


@pytest.mark.parametrize("services", [{"use_ray": False}, {"placement": "colocated"}])
def test_a_trainer_group_needs_ray_and_its_own_bundles(services):
    cfg = _job(launch="group")
    cfg["services"] = services
    with pytest.raises((ConfigError, ValueError), match="trainer.launch"):
        JobConfig.model_validate(cfg)
    assert JobConfig.model_validate(_job(launch="group")).trainer.launch == "group"  # Ray, own bundles: the defaults


def test_a_rank_0_whose_rendezvous_port_was_taken_is_a_port_race_and_anything_else_is_not():
    taken = start_failure("trainer rank 0 exited with code 1", "DistNetworkError: ... code: -98, name: EADDRINUSE")
    assert isinstance(taken, RendezvousPortTaken) and "EADDRINUSE" in str(taken)
    other = start_failure("trainer rank 1 exited with code 1", "RuntimeError: out of memory")
    assert type(other) is Unavailable and "out of memory" in str(other)


def test_a_group_starts_again_on_another_port_a_few_times_then_gives_up(tmp_path, monkeypatch):
    group = TrainerGroup([], 1, tmp_path, {"CPU": 1}, [{}], ["n0:0"])
    outcomes = [RendezvousPortTaken("taken"), RendezvousPortTaken("taken"), "127.0.0.1:1"]

    def once():
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(group, "_create_once", once)
    assert group.create() == "127.0.0.1:1" and not outcomes
    outcomes[:] = [RendezvousPortTaken("taken")] * RENDEZVOUS_TRIES
    with pytest.raises(RendezvousPortTaken):
        group.create()
    assert not outcomes
