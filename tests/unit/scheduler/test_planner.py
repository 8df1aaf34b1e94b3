"""Apportioning workers and assigning ranks, with every expected count and device worked out by hand in the
comments (sizes = parameter count x node costs: forward 1, train 3, rollout 4)."""

from __future__ import annotations

import json

import pytest

from meshrl.scheduler.planning.apportion import ClusterSpec, PlanError, WorkerSlot, apportion, assign_workers
from meshrl.scheduler.planning.planner import Placement, PlanOptions, Strategy, plan_workflow
from meshrl.scheduler.workflow import load_builtin, load_workflow_data

DIS = Placement.DISAGGREGATED


def slots(cluster: ClusterSpec, *spec: str) -> tuple[WorkerSlot, ...]:
    """slots(c, "0:0-2", "1:3") -> the workers n0:0..2 and n1:3."""
    out = []
    for item in spec:
        node, devices = item.split(":")
        lo, _, hi = devices.partition("-")
        for d in range(int(lo), int(hi or lo) + 1):
            out.append(WorkerSlot(int(node) * cluster.workers_per_node + d, int(node), d))
    return tuple(out)


def placed(plan) -> dict[str, tuple[WorkerSlot, ...]]:
    return {g.group_id: g.workers for g in plan.groups}


def with_config(name: str, **node_config: dict):
    data = load_builtin(name).model_dump(mode="json")
    for n in data["nodes"]:
        n["config"].update(node_config.get(n["node_id"], {}))
    return load_workflow_data(data)


# -- apportion / assign_workers --------------------------------------------------------------------------


def test_apportion_largest_remainder():
    # quotas 10 * (5, 3, 2) / 10 -> exact
    assert apportion({"a": 5, "b": 3, "c": 2}, {"a": 1, "b": 1, "c": 1}, 10) == {"a": 5, "b": 3, "c": 2}
    # quotas 7 * (1, 1, 1) / 3 = 2.33 each -> 2, 2, 2, one left: ties go to the larger size, then file order
    assert apportion({"a": 1, "b": 1, "c": 1}, dict.fromkeys("abc", 1), 7) == {"a": 3, "b": 2, "c": 2}
    assert apportion({"a": 1, "b": 1, "c": 1}, dict.fromkeys("abc", 1), 7, sizes={"a": 1, "b": 1, "c": 5}) == {
        "a": 2,
        "b": 2,
        "c": 3,
    }
    # a tiny group still gets one worker; the minimum is taken from the most over-served group:
    # quotas 4 * (100, 1) / 101 = 3.96, 0.04 -> 3 + 1
    assert apportion({"big": 100, "tiny": 1}, {"big": 1, "tiny": 1}, 4) == {"big": 3, "tiny": 1}


def test_apportion_in_whole_replicas_leaves_idle_workers():
    # units 2 and 2 on 5 workers: quotas 2.5 each -> 2 + 2, the fifth worker fits no replica
    assert apportion({"r": 1, "t": 1}, {"r": 2, "t": 2}, 5) == {"r": 2, "t": 2}
    # quotas 6 * (4, 4, 1) / 9 = 2.67, 2.67, 0.67; r in pairs -> 2, then 2 and 1; the last worker goes to t
    assert apportion({"r": 4, "t": 4, "f": 1}, {"r": 2, "t": 1, "f": 1}, 6) == {"r": 2, "t": 3, "f": 1}


def test_apportion_needs_one_replica_per_group():
    with pytest.raises(PlanError) as info:
        apportion({"a": 1, "b": 1, "c": 1}, {"a": 2, "b": 1, "c": 1}, 3)
    assert "need at least 4 workers (a 2, b 1, c 1) but the cluster has 3" in str(info.value)


def test_assign_workers_node_cohesion():
    c = ClusterSpec(3, 2)
    # 3 workers cannot fit one node: the first takes the most free node (n0) whole, then the best fit (n1)
    got = assign_workers({"r": 3, "a": 3}, {"r": 1, "a": 1}, c, ["r", "a"])
    assert got == {"r": slots(c, "0:0-1", "1:0"), "a": slots(c, "1:1", "2:0-1")}
    # best fit keeps whole nodes free: the 1-worker group goes where one device is left
    c = ClusterSpec(2, 4)
    got = assign_workers({"x": 3, "y": 4, "z": 1}, dict.fromkeys("xyz", 1), c, ["y", "x", "z"])
    assert got == {"y": slots(c, "0:0-3"), "x": slots(c, "1:0-2"), "z": slots(c, "1:3")}


def test_cluster_spec_checks():
    with pytest.raises(PlanError):
        ClusterSpec(0, 4)
    with pytest.raises(PlanError) as info:
        ClusterSpec(1, 0)
    assert "--gpus-per-node" in str(info.value)
    assert ClusterSpec(2, 3).slot(4) == WorkerSlot(4, 1, 1)


# -- plans of the built-in workflows ---------------------------------------------------------------------


def test_grpo_colocated_everything_everywhere():
    c = ClusterSpec(1, 4)
    plan = plan_workflow(load_builtin("grpo"), c)
    assert placed(plan) == {"rollout+actor+reference": slots(c, "0:0-3")}
    assert plan.groups_of_subgraph("s1") == () and plan.groups_of_subgraph("s2") == ("rollout+actor+reference",)
    assert plan.model("actor").workers == slots(c, "0:0-3") and plan.model("actor").data_parallel == 4
    sync = [cg for cg in plan.comm_groups if cg.kind == "weight_sync"]
    assert len(sync) == 1 and sync[0].shares_device
    assert [(m.model, m.rank, m.worker.index) for m in sync[0].members] == [
        ("actor", 0, 0),
        ("rollout", 1, 0),
        ("rollout", 2, 1),
        ("rollout", 3, 2),
        ("rollout", 4, 3),
    ]
    assert any("disk weight transport" in n for n in plan.notes)
    assert any("s1 hold no model" in n for n in plan.notes)
    assert plan.idle == ()


def test_grpo_disaggregated_param_aware():
    # sizes: rollout 1B x 4 = 4B (its count comes from the actor); the trainer's models share its workers (one
    # trainer service holds them): actor 1B x (1 + 3) = 4B + reference 1B x 1 = 5B
    # quotas 8 x (4, 5) / 9 = 3.56, 4.44 -> 3, 4; the 8th worker: the larger remainder (rollout, .56) -> 4, 4
    # placement, largest first (a tie in count: the larger size first): trainer 4 -> n0; rollout 4 -> n1
    c = ClusterSpec(2, 4)
    options = PlanOptions(placement=DIS, param_counts={"actor": "1B", "reference": 1_000_000_000})
    plan = plan_workflow(load_builtin("grpo"), c, options)
    assert placed(plan) == {"rollout": slots(c, "1:0-3"), "actor+reference": slots(c, "0:0-3")}
    assert plan.group("actor+reference").subgraph_ids == ("s2", "s3", "s4")
    assert plan.group("rollout").subgraph_ids == ("s0",)
    rollout = plan.model("rollout")
    assert (rollout.param_count, rollout.param_source, rollout.size) == (10**9, "actor", 4e9)
    assert plan.model("actor").node_ids == ("old_logprob", "actor_train") and plan.model("actor").cost == 4.0
    comm = {cg.name: cg for cg in plan.comm_groups}
    assert set(comm) == {"actor", "reference", "actor->rollout"}
    assert [m.worker.index for m in comm["actor"].members] == [0, 1, 2, 3]
    assert [m.worker.index for m in comm["reference"].members] == [0, 1, 2, 3]  # the same world
    assert [m.worker.index for m in comm["actor->rollout"].members] == [0, 4, 5, 6, 7]
    assert not comm["actor->rollout"].shares_device and comm["actor"].backend == "nccl"


def test_ppo_disaggregated_puts_every_trainer_role_on_the_trainers_workers():
    # groups (file order): rollout 4B; the trainer: critic 1B x (1 + 3) + actor 4B + reference 1B = 9B
    # quotas 8 x (4, 9) / 13 = 2.46, 5.54 -> 2, 5; the 8th worker: the larger remainder (trainer, .54) -> 2, 6
    # placement: the trainer's 6 fit no node -> n0:0-3 and n1:0-1; rollout 2 -> n1:2-3
    c = ClusterSpec(2, 4)
    options = PlanOptions(placement=DIS, param_counts={"actor": "1B", "critic": "1B", "reference": "1B"})
    plan = plan_workflow(load_builtin("ppo"), c, options)
    assert placed(plan) == {"rollout": slots(c, "1:2-3"), "critic+actor+reference": slots(c, "0:0-3", "1:0-1")}
    assert {m.key: m.workers for m in plan.models}["critic"] == slots(c, "0:0-3", "1:0-1")


def test_even_strategy_without_param_counts():
    # 8 workers / 2 groups = 4 each; placement, a tie in count: the larger size first (the trainer: actor's
    # 1 + 3 and reference's 1 = 5 against rollout's 4) -> trainer 0:0-3, rollout 0:4-7
    c = ClusterSpec(1, 8)
    plan = plan_workflow(load_builtin("grpo"), c, PlanOptions(placement=DIS, strategy=Strategy.EVEN))
    assert placed(plan) == {"rollout": slots(c, "0:4-7"), "actor+reference": slots(c, "0:0-3")}
    assert any("no parameter counts" in n for n in plan.notes)


def test_tensor_parallel_rollout_replicas():
    # units rollout 2; quotas 6 x (4, 5) / 9 = 2.67, 3.33 -> rollout 2 (one pair), trainer 3; one worker
    # left: rollout cannot take a half pair -> trainer 4
    # placement: the trainer's 4 fit no node -> n0:0-2 and n1:0; rollout's pair -> n1:1-2
    c = ClusterSpec(2, 3)
    wf = with_config("grpo", rollout={"tensor_parallel_size": 2})
    options = PlanOptions(placement=DIS, param_counts={"actor": "1B", "reference": "1B"})
    plan = plan_workflow(wf, c, options)
    assert placed(plan) == {"rollout": slots(c, "1:1-2"), "actor+reference": slots(c, "0:0-2", "1:0")}
    rollout = plan.model("rollout")
    assert rollout.replicas == ((4, 5),) and rollout.data_parallel == 1 and rollout.unit == 2
    comm = {cg.name: cg for cg in plan.comm_groups}
    assert comm["rollout.replica0"].kind == "tensor_parallel"
    assert [m.worker.index for m in comm["rollout.replica0"].members] == [4, 5]
    assert [m.worker.index for m in comm["actor->rollout"].members] == [0, 4]


def test_replica_sizes_can_leave_workers_idle():
    # DAPO with rollout and actor in pairs on 5 workers: 2 + 2, one idle
    c = ClusterSpec(1, 5)
    wf = with_config(
        "dapo",
        rollout={"tensor_parallel_size": 2},
        old_logprob={"tensor_parallel_size": 2},
        actor_train={"tensor_parallel_size": 2},
    )
    plan = plan_workflow(wf, c, PlanOptions(placement=DIS))
    assert placed(plan) == {"rollout": slots(c, "0:0-1"), "actor": slots(c, "0:2-3")}
    assert plan.idle == slots(c, "0:4") and any("idle" in n for n in plan.notes)
    assert plan.model("actor").data_parallel == 1


def test_two_agents(kit):
    # models a.rollout 1B x 4 = 4B, a.actor 1B x 3 = 3B, b.rollout 3B x 4 = 12B, b.actor 3B x 3 = 9B (28B)
    # quotas 16 x (4, 3, 12, 9) / 28 = 2.29, 1.71, 6.86, 5.14 -> 2, 1, 6, 5; two left: b.rollout (.86),
    # then a.actor (.71) -> 2, 2, 7, 5
    # placement, largest first: b.rollout 7 -> n0:0-6; b.actor 5 -> n1:0-4; a.rollout 2 -> n1:5-6;
    # a.actor 2 fits no node -> one on n0:7, one on n1:7
    wf = kit.build(kit.two_agents())
    c = ClusterSpec(2, 8)
    options = PlanOptions(placement=DIS, param_counts={"a.actor": "1B", "b.actor": "3B"})
    plan = plan_workflow(wf, c, options)
    assert placed(plan) == {
        "a.rollout": slots(c, "1:5-6"),
        "a.actor": slots(c, "0:7", "1:7"),
        "b.rollout": slots(c, "0:0-6"),
        "b.actor": slots(c, "1:0-4"),
    }
    comm = {cg.name: [m.worker.index for m in cg.members] for cg in plan.comm_groups}
    assert comm["a.actor->a.rollout"] == [7, 13, 14]
    assert comm["b.actor->b.rollout"] == [8, 0, 1, 2, 3, 4, 5, 6]
    colocated = plan_workflow(wf, c, PlanOptions(param_counts={"a.actor": "1B", "b.actor": "3B"}))
    assert placed(colocated) == {"a.rollout+a.actor+b.rollout+b.actor": c.slots()}


def test_series_trainer_models_in_one_subgraph_share_workers(kit):
    # siiRL's chain-shaped PPO: one subgraph; disaggregated keeps rollout apart, the trainer models time-share
    nodes = [
        kit.node("data", "DATA_LOAD"),
        kit.node("rollout", "ROLLOUT", deps=("data",)),
        kit.node("reward", "COMPUTE", "REWARD", ("rollout",)),
        kit.node("old_lp", "MODEL_TRAIN", "ACTOR", ("reward",), only_forward_compute=True),
        kit.node("ref_lp", "MODEL_INFERENCE", "REFERENCE", ("old_lp",)),
        kit.node("values", "MODEL_INFERENCE", "CRITIC", ("ref_lp",)),
        kit.node("adv", "COMPUTE", "ADVANTAGE", ("values",)),
        kit.node("critic_train", "MODEL_TRAIN", "CRITIC", ("adv",)),
        kit.node("actor_train", "MODEL_TRAIN", "ACTOR", ("critic_train",)),
    ]
    # sizes (no counts): rollout 4, trainer side actor 1+3, reference 1, critic 1+3 = 9 -> 8 x (4, 9) / 13
    # = 2.46, 5.54 -> 2, 5; the last worker to the trainers (.54 > .46)
    c = ClusterSpec(1, 8)
    plan = plan_workflow(kit.build(nodes), c, PlanOptions(placement=DIS))
    assert plan.split.chains() == [tuple(n["node_id"] for n in nodes)]
    assert placed(plan) == {"rollout": slots(c, "0:6-7"), "actor+reference+critic": slots(c, "0:0-5")}
    assert plan.model("actor").cost == 4.0


def test_plan_errors(kit):
    with pytest.raises(PlanError) as info:
        plan_workflow(load_builtin("grpo"), ClusterSpec(1, 1), PlanOptions(placement=DIS))
    assert "need at least 2 workers" in str(info.value) and "--placement colocated" in str(info.value)
    with pytest.raises(PlanError) as info:
        plan_workflow(with_config("grpo", rollout={"tensor_parallel_size": 4}), ClusterSpec(1, 6))
    assert "multiple of 4 workers" in str(info.value)
    with pytest.raises(PlanError) as info:
        plan_workflow(load_builtin("ppo"), ClusterSpec(1, 8), PlanOptions(param_counts={"actor": "7B"}))
    assert "unknown: critic, reference" in str(info.value) and "--strategy even" in str(info.value)
    with pytest.raises(PlanError) as info:
        plan_workflow(load_builtin("grpo"), ClusterSpec(1, 8), PlanOptions(param_counts={"policy": "7B"}))
    assert "policy" in str(info.value) and "rollout, actor, reference" in str(info.value)
    with pytest.raises(PlanError) as info:
        wf = with_config("grpo", old_logprob={"tensor_parallel_size": 2}, actor_train={"tensor_parallel_size": 1})
        plan_workflow(wf, ClusterSpec(1, 8))
    assert "old_logprob=2, actor_train=1" in str(info.value)
    with pytest.raises(PlanError) as info:
        plan_workflow(load_builtin("grpo"), ClusterSpec(1, 8), PlanOptions(param_counts={"actor": "lots"}))
    assert "actor=7B" in str(info.value)


def test_param_counts_from_node_config_and_role_names():
    wf = with_config("grpo", ref_logprob={"param_count": "500M"}, old_logprob={"param_count": "7B"})
    plan = plan_workflow(wf, ClusterSpec(1, 8), PlanOptions(param_counts={"actor": "1.5B"}))
    assert plan.model("actor").param_count == 1_500_000_000 and plan.model("actor").param_source == "given"
    assert (plan.model("reference").param_count, plan.model("reference").param_source) == (5 * 10**8, "node config")
    assert plan.model("rollout").param_count == 1_500_000_000


def test_plan_to_dict_is_json():
    plan = plan_workflow(load_builtin("ppo"), ClusterSpec(2, 4), PlanOptions(placement=DIS, strategy=Strategy.EVEN))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["placement"] == "disaggregated" and len(data["subgraphs"]) == 8
    assert sum(len(g["workers"]) for g in data["groups"]) + len(data["idle"]) == 8
    assert data["models"][0]["key"] == "rollout" and data["models"][0]["role"] == "ROLLOUT"


def test_workflow_without_models_leaves_every_worker_idle(kit):
    wf = kit.build([kit.node("data", "DATA_LOAD"), kit.node("reward", "COMPUTE", "REWARD", ("data",))])
    c = ClusterSpec(1, 2)
    for placement in Placement:
        plan = plan_workflow(wf, c, PlanOptions(placement=placement))
        assert plan.groups == () and plan.idle == c.slots() and plan.comm_groups == ()
        assert "the workflow uses no model: every worker is idle" in plan.notes
