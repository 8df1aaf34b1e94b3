"""Each validation error of a workflow file names its node and says how to fix it."""

from __future__ import annotations

import pytest

from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.workflow import NodeRole, NodeType, WorkflowError, load_workflow_text


def only(err: WorkflowError):
    assert len(err.problems) == 1, err.problems
    return err.problems[0]


def test_valid_chain_loads_with_defaults(kit):
    wf = kit.build(kit.chain())
    assert wf.node_ids == ("data", "rollout", "reward", "advantage", "train")
    train = wf.node("train")
    assert train.node_type is NodeType.MODEL_TRAIN and train.node_role is NodeRole.ACTOR
    assert train.dependencies == ("advantage",) and train.config == {} and not train.only_forward_compute
    assert str(train.node_type) == "MODEL_TRAIN" and str(train.node_role) == "ACTOR"
    assert train.model_key == "actor" and wf.node("reward").model_key is None


def test_error_is_invalid_argument_with_node_and_fix(kit):
    nodes = kit.chain()
    nodes[4]["dependencies"] = ["advantag"]
    err = kit.problems(nodes)
    assert isinstance(err, InvalidArgument)
    p = only(err)
    assert (err.node_id, p.field) == ("train", "dependencies")
    assert "'advantag', which is not a node" in p.message and "did you mean 'advantage'?" in err.fix
    assert "node 'train'" in str(err) and "Fix:" in str(err)


def test_yaml_syntax_error_names_the_line(kit):
    p = only(kit.problems(text="dag_id: t\nnodes:\n  - node_id: [a\n"))
    assert p.node_id is None and "not valid YAML at line" in p.message


def test_top_level_must_be_a_mapping(kit):
    assert "not a mapping" in only(kit.problems(text="- a\n- b\n")).message


def test_duplicate_yaml_key_is_rejected(kit):
    text = """\
        dag_id: t
        nodes:
          - node_id: data
            node_type: DATA_LOAD
            node_type: ROLLOUT
        """
    assert "duplicate key 'node_type'" in only(kit.problems(text=text)).message


def test_unknown_top_level_field_suggests_the_right_one(kit):
    err = kit.problems(text=kit.as_yaml(kit.chain()) + "descripton: x\n")
    p = only(err)
    assert p.node_id is None and "unknown field 'descripton'" in p.message and "'description'" in p.fix


def test_unknown_node_field_suggests_the_right_one(kit):
    nodes = kit.chain()
    nodes[2]["dependecies"] = nodes[2].pop("dependencies")
    p = only(kit.problems(nodes))
    assert p.node_id == "reward" and "unknown field 'dependecies'" in p.message and "'dependencies'" in p.fix


def test_bad_node_type_and_role(kit):
    nodes = kit.chain()
    nodes[1]["node_type"] = "ROLLOUTT"
    nodes[3]["node_role"] = "ADVANTAGES"
    err = kit.problems(nodes)
    by_node = {p.node_id: p for p in err.problems}
    assert "node_type 'ROLLOUTT'" in by_node["rollout"].message and "'ROLLOUT'" in by_node["rollout"].fix
    assert "node_role 'ADVANTAGES'" in by_node["advantage"].message and "'ADVANTAGE'" in by_node["advantage"].fix


def test_role_not_valid_for_type(kit):
    nodes = kit.chain()
    nodes[4]["node_role"] = "REFERENCE"
    p = only(kit.problems(nodes))
    assert p.node_id == "train" and "REFERENCE is not valid for a MODEL_TRAIN node" in p.message
    assert p.fix == "use node_role ACTOR or CRITIC"


def test_missing_role_defaults_when_unambiguous_else_error(kit):
    nodes = kit.chain()
    del nodes[0]["node_role"], nodes[1]["node_role"]
    wf = kit.build(nodes)
    assert wf.node("data").node_role is NodeRole.DATA and wf.node("rollout").node_role is NodeRole.ROLLOUT
    del nodes[4]["node_role"]
    p = only(kit.problems(nodes))
    assert p.node_id == "train" and "'node_role' is required" in p.message and "ACTOR, CRITIC" in p.fix


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("dependencies", "advantage", "dependencies"),
        ("only_forward_compute", "yes", "only_forward_compute"),
        ("config", ["a"], "config"),
        ("node_id", "train step", "node_id 'train step' is not well-formed"),
    ],
)
def test_bad_field_types(kit, field, value, expected):
    nodes = kit.chain()
    nodes[4][field] = value
    p = only(kit.problems(nodes))
    assert p.node_id in ("train", "train step") and expected in p.message


def test_empty_nodes(kit):
    p = only(kit.problems([]))
    assert "no nodes" in p.message


def test_duplicate_node_id(kit):
    nodes = kit.chain() + [kit.node("reward", "COMPUTE", "REWARD", ("rollout",))]
    p = only(kit.problems(nodes))
    assert p.node_id == "reward" and "more than one node" in p.message


def test_self_and_repeated_dependencies(kit):
    nodes = kit.chain()
    nodes[2]["dependencies"] = ["rollout", "reward"]
    nodes[3]["dependencies"] = ["reward", "reward"]
    err = kit.problems(nodes)
    assert {(p.node_id, p.message) for p in err.problems} == {
        ("reward", "depends on itself"),
        ("advantage", "lists a dependency twice"),
    }


def test_cycle_is_reported_with_its_path(kit):
    nodes = kit.chain() + [kit.node("filter", "COMPUTE", "DYNAMIC_SAMPLING", ("advantage",))]
    nodes[2]["dependencies"] = ["rollout", "filter"]
    p = only(kit.problems(nodes))
    assert p.node_id in ("reward", "advantage", "filter")
    assert "cycle" in p.message
    for name in ("'reward'", "'advantage'", "'filter'"):
        assert name in p.message
    assert "remove one of these dependencies" in p.fix


def test_node_without_dependencies_that_is_not_an_entry(kit):
    nodes = kit.chain()
    nodes[3]["dependencies"] = []
    err = kit.problems(nodes)
    first, second = err.problems
    assert first.node_id == "advantage" and "has no dependencies" in first.message
    assert "DATA_LOAD or ROLLOUT" in first.fix
    assert second.node_id == "train" and "every path into it starts at 'advantage'" in second.message


def test_node_unreachable_from_an_entry(kit):
    nodes = kit.chain() + [
        kit.node("stray", "COMPUTE", "REWARD"),
        kit.node("stray_adv", "COMPUTE", "ADVANTAGE", ("stray",)),
    ]
    err = kit.problems(nodes)
    by_node = {p.node_id: p for p in err.problems}
    assert set(by_node) == {"stray", "stray_adv"}
    assert "unreachable from the entry nodes (data)" in by_node["stray_adv"].message


def test_workflow_without_entry(kit):
    nodes = [kit.node("reward", "COMPUTE", "REWARD"), kit.node("adv", "COMPUTE", "ADVANTAGE", ("reward",))]
    err = kit.problems(nodes)
    assert any(p.node_id is None and "no entry node" in p.message for p in err.problems)


def test_only_forward_compute_and_executable_ref_on_wrong_types(kit):
    nodes = kit.chain()
    nodes[2]["only_forward_compute"] = True
    nodes[4]["executable_ref"] = "meshrl.common.errors:from_rpc_error"
    err = kit.problems(nodes)
    by_node = {p.node_id: p for p in err.problems}
    assert "only_forward_compute applies to model nodes" in by_node["reward"].message
    assert "only run on COMPUTE nodes" in by_node["train"].message


def test_compute_node_needs_a_builtin_or_an_executable(kit):
    nodes = kit.chain() + [kit.node("custom", "COMPUTE", "DEFAULT", ("advantage",))]
    p = only(kit.problems(nodes))
    assert p.node_id == "custom" and "no built-in function" in p.message and "executable_ref" in p.fix


def test_unknown_builtin_estimator(kit):
    nodes = kit.chain()
    nodes[3]["config"] = {"estimator": "rlo"}
    p = only(kit.problems(nodes))
    assert p.node_id == "advantage" and "'rlo' is not a built-in advantage function" in p.message
    assert "'rloo'" in p.fix


def test_planner_config_keys_are_typed(kit):
    nodes = kit.chain()
    nodes[1]["config"] = {"tensor_parallel_size": 0}
    nodes[3]["config"] = {"tensor_parallel_size": 2}
    nodes[4]["config"] = {"param_count": "seven", "agent": "a b"}
    err = kit.problems(nodes)
    got = {(p.node_id, p.field) for p in err.problems}
    assert got == {
        ("rollout", "config.tensor_parallel_size"),
        ("advantage", "config.tensor_parallel_size"),
        ("train", "config.param_count"),
        ("train", "config.agent"),
    }


def test_columns_must_exist_and_be_written_upstream(kit):
    nodes = kit.chain()
    nodes[0]["config"] = {"outputs": ["prompt_ids", "answer"]}
    nodes[1]["config"] = {"outputs": ["response_ids", "group_index"]}
    nodes[2]["config"] = {"outputs": ["reward"]}
    p = only(kit.problems(nodes))
    assert p.node_id == "reward" and "unknown column 'reward'" in p.message and "'rewards'" in p.fix
    nodes[2]["config"] = {"outputs": ["rewards"]}
    nodes[3]["config"] = {"inputs": ["rewards", "values"], "outputs": ["advantages"]}
    p = only(kit.problems(nodes))
    assert p.node_id == "advantage" and "reads column 'values'" in p.message
    nodes[3]["config"]["inputs"] = ["rewards", "group_index"]
    kit.build(nodes)


def test_all_problems_are_reported_at_once(kit):
    nodes = kit.chain()
    nodes[1]["dependencies"] = ["dta"]
    nodes[4]["dependencies"] = ["advantage", "missing"]
    err = kit.problems(nodes)
    assert [p.node_id for p in err.problems] == ["rollout", "train"]
    assert "2 problems" in str(err)


def test_fan_out_is_allowed(kit):
    nodes = kit.chain() + [kit.node("critic_train", "MODEL_TRAIN", "CRITIC", ("advantage",))]
    wf = kit.build(nodes)
    assert [n.node_id for n in wf.nodes if "advantage" in n.dependencies] == ["train", "critic_train"]


def test_anchors_and_merge_keys(kit):
    text = """\
        dag_id: anchored
        x-forward: &forward
          inputs: [prompt_ids, response_ids]
          micro_batch: 4
        nodes:
          - node_id: data
            node_type: DATA_LOAD
          - node_id: rollout
            node_type: ROLLOUT
            dependencies: [data]
          - node_id: old_lp
            node_type: MODEL_INFERENCE
            node_role: ACTOR
            dependencies: [rollout]
            config: {<<: *forward, micro_batch: 8}
          - node_id: ref_lp
            node_type: MODEL_INFERENCE
            node_role: REFERENCE
            dependencies: [rollout]
            config: *forward
        """
    import textwrap

    wf = load_workflow_text(textwrap.dedent(text))
    assert wf.node("old_lp").config == {"inputs": ["prompt_ids", "response_ids"], "micro_batch": 8}
    assert wf.node("ref_lp").config == {"inputs": ["prompt_ids", "response_ids"], "micro_batch": 4}


def test_reading_a_column_no_ancestor_writes_fails_at_load_even_past_undeclared_nodes(kit, user_module):
    """Built-in nodes that declare no outputs count with what they write; a user node counts with what it
    declares, so a read through one that declares nothing is refused and the fix names it."""
    nodes = kit.chain()  # data -> rollout -> reward -> advantage -> train, no columns declared
    nodes[4]["config"] = {"inputs": ["prompt_ids", "response_ids", "advantages", "rewards"]}
    kit.build(nodes)  # the built-ins write all four
    module = user_module("def fn(batch, config):\n    return {}\n")
    scorer = kit.node("scorer", "COMPUTE", "DEFAULT", ("advantage",))
    scorer["executable_ref"] = f"{module}:fn"
    nodes[4]["dependencies"] = ["scorer"]
    nodes[4]["config"]["inputs"].append("values")
    p = only(kit.problems([*nodes[:4], scorer, nodes[4]], allowed_modules=[module]))
    assert p.node_id == "train" and "reads column 'values', which no upstream node writes" in p.message
    assert "declare config.outputs on 'scorer'" in p.fix
    scorer["config"] = {"outputs": ["values"]}
    kit.build([*nodes[:4], scorer, nodes[4]], allowed_modules=[module])
