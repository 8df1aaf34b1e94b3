"""The task graph's orderings and the split into irreducible subgraphs, with expectations written by hand."""

from __future__ import annotations

import pytest

from meshrl.scheduler.planning.subgraphs import SplitKind, SplitPoint, split_irreducible
from meshrl.scheduler.workflow import load_builtin
from meshrl.scheduler.workflow.taskgraph import TaskGraph, find_cycle

D, F, R = SplitKind.DIVERGE, SplitKind.FAN_OUT, SplitKind.RECONVERGE


def graph_of(name: str) -> TaskGraph:
    return TaskGraph.from_workflow(load_builtin(name))


def test_find_cycle():
    assert find_cycle({"a": [], "b": ["a"], "c": ["b"]}) is None
    assert find_cycle({"a": ["c"], "b": ["a"], "c": ["b"]}) == ["a", "c", "b", "a"]
    assert find_cycle({"a": ["a"]}) == ["a", "a"]
    assert find_cycle({"a": ["zzz"]}) is None  # unknown names are the loader's business


def test_orderings_on_grpo():
    g = graph_of("grpo")
    assert g.entries == ("data_load",) and g.exits == ("actor_train",)
    assert g.topological_order == (
        "data_load",
        "rollout",
        "reward",
        "advantage",
        "old_logprob",
        "ref_logprob",
        "actor_train",
    )
    assert g.levels() == [
        ("data_load",),
        ("rollout",),
        ("reward", "old_logprob", "ref_logprob"),
        ("advantage",),
        ("actor_train",),
    ]
    assert g.ready({"data_load", "rollout"}) == ("reward", "old_logprob", "ref_logprob")
    assert g.ready({"data_load", "rollout", "reward", "old_logprob"}) == ("advantage", "ref_logprob")
    assert g.ancestors("advantage") == {"reward", "rollout", "data_load"}
    assert g.descendants("rollout") == {"reward", "advantage", "old_logprob", "ref_logprob", "actor_train"}
    assert g.reachable_exits("reward") == {"actor_train"}
    sub = g.subgraph("branch", ["old_logprob", "actor_train"])
    assert sub.parents["actor_train"] == ("old_logprob",) and sub.entries == ("old_logprob",)


def test_a_chain_is_irreducible():
    split = split_irreducible(graph_of("rloo"))
    assert split.chains() == [("data_load", "rollout", "reward", "advantage", "old_logprob", "actor_train")]
    assert split.points == ()


def test_grpo_reconverging_branches():
    split = split_irreducible(graph_of("grpo"))
    assert split.chains() == [
        ("data_load", "rollout"),
        ("reward", "advantage"),
        ("old_logprob",),
        ("ref_logprob",),
        ("actor_train",),
    ]
    assert [(sg.subgraph_id, sg.upstream, sg.downstream) for sg in split.subgraphs] == [
        ("s0", (), ("s1", "s2", "s3")),
        ("s1", ("s0",), ("s4",)),
        ("s2", ("s0",), ("s4",)),
        ("s3", ("s0",), ("s4",)),
        ("s4", ("s1", "s2", "s3"), ()),
    ]
    assert split.points == (
        SplitPoint(D, "rollout", ("reward", "old_logprob", "ref_logprob"), meets=("actor_train",)),
        SplitPoint(R, "actor_train", ("advantage", "old_logprob", "ref_logprob")),
    )
    assert split.concurrent("s1", "s2") and split.concurrent("s2", "s3")
    assert not split.concurrent("s0", "s1") and not split.concurrent("s1", "s4") and not split.concurrent("s2", "s2")
    assert split.subgraph_of("advantage").subgraph_id == "s1"


def test_ppo_fan_out_to_disjoint_exits_and_reconvergence():
    split = split_irreducible(graph_of("ppo"))
    assert split.chains() == [
        ("data_load", "rollout"),
        ("reward",),
        ("values",),
        ("old_logprob",),
        ("ref_logprob",),
        ("advantage",),
        ("actor_train",),
        ("critic_train",),
    ]
    assert split.subgraph("s5").upstream == ("s1", "s2") and split.subgraph("s5").downstream == ("s6", "s7")
    assert split.subgraph("s6").upstream == ("s5", "s3", "s4")
    assert split.points == (
        SplitPoint(
            D, "rollout", ("reward", "values", "old_logprob", "ref_logprob"), meets=("advantage", "actor_train")
        ),
        SplitPoint(F, "advantage", ("actor_train", "critic_train"), exits=(("actor_train",), ("critic_train",))),
        SplitPoint(R, "advantage", ("reward", "values")),
        SplitPoint(R, "actor_train", ("advantage", "old_logprob", "ref_logprob")),
    )
    assert split.concurrent("s6", "s7")
    assert split.points[1].describe() == (
        "'advantage' fans out to disjoint exits: actor_train -> {actor_train}; critic_train -> {critic_train}"
    )


@pytest.mark.parametrize(
    ("name", "chains", "points"),
    [
        (
            "dapo",
            [
                ("data_load", "rollout", "reward", "dynamic_sampling"),
                ("advantage",),
                ("old_logprob",),
                ("actor_train",),
            ],
            (
                SplitPoint(D, "dynamic_sampling", ("advantage", "old_logprob"), meets=("actor_train",)),
                SplitPoint(R, "actor_train", ("advantage", "old_logprob")),
            ),
        ),
        (
            "reinforce_pp",
            [("data_load", "rollout"), ("reward",), ("old_logprob",), ("ref_logprob",), ("advantage", "actor_train")],
            (
                SplitPoint(D, "rollout", ("reward", "old_logprob", "ref_logprob"), meets=("advantage",)),
                SplitPoint(R, "advantage", ("reward", "old_logprob", "ref_logprob")),
            ),
        ),
    ],
)
def test_other_builtins(name, chains, points):
    split = split_irreducible(graph_of(name))
    assert split.chains() == chains and split.points == points


def test_two_agents_fan_out_from_one_data_load(kit):
    split = split_irreducible(TaskGraph.from_workflow(kit.build(kit.two_agents())))
    assert split.chains() == [("data",), ("rollout_a", "reward_a", "train_a"), ("rollout_b", "reward_b", "train_b")]
    assert split.points == (SplitPoint(F, "data", ("rollout_a", "rollout_b"), exits=(("train_a",), ("train_b",))),)
    assert split.concurrent("s1", "s2")


def test_one_fork_both_fanning_out_and_reconverging(kit):
    nodes = [
        kit.node("data", "DATA_LOAD"),
        kit.node("rollout", "ROLLOUT", deps=("data",)),
        kit.node("reward", "COMPUTE", "REWARD", ("rollout",)),
        kit.node("old_lp", "MODEL_INFERENCE", "ACTOR", ("rollout",)),
        kit.node("values", "MODEL_INFERENCE", "CRITIC", ("rollout",)),
        kit.node("adv", "COMPUTE", "ADVANTAGE", ("reward",)),
        kit.node("train", "MODEL_TRAIN", "ACTOR", ("adv", "old_lp")),
        kit.node("critic_train", "MODEL_TRAIN", "CRITIC", ("values",)),
    ]
    split = split_irreducible(TaskGraph.from_workflow(kit.build(nodes)))
    assert split.chains() == [
        ("data", "rollout"),
        ("reward", "adv"),
        ("old_lp",),
        ("values", "critic_train"),
        ("train",),
    ]
    assert split.points == (
        SplitPoint(
            F,
            "rollout",
            ("reward", "old_lp", "values"),
            exits=(("train",), ("train",), ("critic_train",)),
        ),
        SplitPoint(D, "rollout", ("reward", "old_lp"), meets=("train",)),
        SplitPoint(R, "train", ("adv", "old_lp")),
    )


def test_two_entries_reconverging(kit):
    nodes = [
        kit.node("math", "DATA_LOAD"),
        kit.node("code", "DATA_LOAD"),
        kit.node("rollout", "ROLLOUT", deps=("math", "code")),
        kit.node("reward", "COMPUTE", "REWARD", ("rollout",)),
        kit.node("train", "MODEL_TRAIN", "ACTOR", ("reward",)),
    ]
    split = split_irreducible(TaskGraph.from_workflow(kit.build(nodes)))
    assert split.chains() == [("math",), ("code",), ("rollout", "reward", "train")]
    assert split.points == (SplitPoint(R, "rollout", ("math", "code")),)
    assert split.concurrent("s0", "s1") and split.subgraph("s2").upstream == ("s0", "s1")
