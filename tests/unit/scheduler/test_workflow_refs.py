"""References to the global config, executable_ref checks (allow-list before import), and the built-ins."""

from __future__ import annotations

import sys

import pytest

from meshrl.common.errors import NotFound
from meshrl.scheduler.workflow import (
    NodeType,
    WorkflowError,
    builtin_names,
    builtin_workflow_text,
    load_builtin,
    load_workflow,
    resolve_executable,
)

USER_FUNCTIONS = """
    import json as json_module

    SCALE = 2

    def score(batch, config):
        return {"rewards": [1.0]}

    class Filters:
        @staticmethod
        def keep(batch, config):
            return batch

    def _private(batch, config):
        return batch
"""


# -- ${config...} references ---------------------------------------------------------------------------


def test_references_take_typed_values_and_defaults(kit):
    nodes = kit.chain()
    nodes[1]["config"] = {
        "n": "${config.rollout.n}",
        "temperature": "${config.rollout.temperature:-0.7}",
        "stop": "${config.rollout.stop}",
        "label": "n=${config.rollout.n}, t=${config.missing.t:-1.5}",
        "literal": "$${config.rollout.n}",
        "first": "${config.models.0.name}",
    }
    nodes[4]["only_forward_compute"] = "${config.flags.forward_only:-false}"
    config = {"rollout": {"n": 8, "stop": ["</s>", "\n"]}, "models": [{"name": "policy"}]}
    wf = kit.build(nodes, config=config)
    assert wf.node("rollout").config == {
        "n": 8,
        "temperature": 0.7,
        "stop": ["</s>", "\n"],
        "label": "n=8, t=1.5",
        "literal": "${config.rollout.n}",
        "first": "policy",
    }
    assert wf.node("train").only_forward_compute is False
    config["rollout"]["stop"].append("x")  # the workflow holds a copy
    assert wf.node("rollout").config["stop"] == ["</s>", "\n"]


def test_reference_accepts_a_pydantic_config(kit):
    import pydantic

    class Rollout(pydantic.BaseModel):
        n: int = 6

    class Job(pydantic.BaseModel):
        rollout: Rollout = Rollout()

    nodes = kit.chain()
    nodes[1]["config"] = {"n": "${config.rollout.n}"}
    assert kit.build(nodes, config=Job()).node("rollout").config["n"] == 6


def test_missing_reference_names_node_and_fix(kit):
    nodes = kit.chain()
    nodes[1]["config"] = {"n": "${config.rollout.n_samples}"}
    err = kit.problems(nodes, config={"rollout": {"n": 4}})
    (p,) = err.problems
    assert p.node_id == "rollout" and "'${config.rollout.n_samples}' is not set" in p.message
    assert "nodes[1].config.n" in p.message and "${config.rollout.n_samples:-VALUE}" in p.fix


def test_malformed_reference(kit):
    nodes = kit.chain()
    nodes[2]["config"] = {"fn": "${cfg.reward}"}
    (p,) = kit.problems(nodes).problems
    assert p.node_id == "reward" and "not a config reference" in p.message


def test_substituted_value_is_type_checked(kit):
    nodes = kit.chain()
    nodes[4]["only_forward_compute"] = "${config.flag}"
    (p,) = kit.problems(nodes, config={"flag": "maybe"}).problems
    assert p.node_id == "train" and p.field == "only_forward_compute"


# -- executable_ref ------------------------------------------------------------------------------------


def _with_ref(kit, ref: str) -> list[dict]:
    nodes = kit.chain()
    nodes.append(kit.node("custom", "COMPUTE", "DEFAULT", ("advantage",), executable_ref=ref))
    return nodes


def test_executable_ref_imports_when_allowed(kit, user_module):
    mod = user_module(USER_FUNCTIONS)
    wf = kit.build(_with_ref(kit, f"{mod}:score"), allowed_modules=[mod])
    assert wf.node("custom").executable_ref == f"{mod}:score"
    fn = resolve_executable(f"{mod}:Filters.keep", [mod], node_id="custom")
    assert fn("b", {}) == "b"


def test_executable_ref_outside_allowed_prefixes_is_not_imported(kit, user_module):
    mod = user_module("raise RuntimeError('must not be imported')\ndef score(batch, config):\n    return {}\n")
    (p,) = kit.problems(_with_ref(kit, f"{mod}:score")).problems
    assert p.node_id == "custom" and "outside the allowed modules [meshrl]" in p.message
    assert f"add '{mod}'" in p.fix
    assert mod not in sys.modules
    # a prefix matches whole dotted components only
    (p,) = kit.problems(_with_ref(kit, f"{mod}:score"), allowed_modules=[mod[:-1]]).problems
    assert "outside the allowed modules" in p.message and mod not in sys.modules


def test_allowed_modules_from_environment(kit, user_module, monkeypatch):
    mod = user_module(USER_FUNCTIONS)
    monkeypatch.setenv("MESHRL_ALLOWED_MODULES", f"other, {mod}")
    kit.build(_with_ref(kit, f"{mod}:score"))
    monkeypatch.setenv("MESHRL_ALLOWED_MODULES", "*")
    kit.build(_with_ref(kit, f"{mod}:score"))


@pytest.mark.parametrize(
    ("attr", "message", "fix"),
    [
        ("scor", "has no attribute 'scor'", "did you mean"),
        ("SCALE", "names a int, not a function", "point it at a function"),
        ("_private", "private attribute", "public function"),
        ("json_module.loads", "walks into module 'json'", "json:FUNCTION"),
    ],
)
def test_executable_ref_bad_attribute(kit, user_module, attr, message, fix):
    mod = user_module(USER_FUNCTIONS)
    (p,) = kit.problems(_with_ref(kit, f"{mod}:{attr}"), allowed_modules=[mod]).problems
    assert p.node_id == "custom" and message in p.message and fix in p.fix


def test_executable_ref_defined_outside_allowed_modules(kit, user_module):
    mod = user_module("from os.path import join as joiner\n")
    (p,) = kit.problems(_with_ref(kit, f"{mod}:joiner"), allowed_modules=[mod]).problems
    assert "is defined in" in p.message and "outside the allowed modules" in p.message


def test_executable_ref_module_missing_or_broken(kit, user_module):
    (p,) = kit.problems(_with_ref(kit, "mrl_no_such_module_xyz:score"), allowed_modules=["*"]).problems
    assert "cannot be imported" in p.message and "PYTHONPATH" in p.fix
    mod = user_module("raise ValueError('broken at import')\n")
    (p,) = kit.problems(_with_ref(kit, f"{mod}:score"), allowed_modules=[mod]).problems
    assert "raised ValueError: broken at import" in p.message


def test_executable_ref_format(kit):
    (p,) = kit.problems(_with_ref(kit, "my_rewards.score")).problems
    assert p.node_id == "custom" and "not well-formed" in p.message and "package.module:function" in p.fix


def test_executable_ref_import_can_be_skipped(kit):
    kit.build(
        _with_ref(kit, "mrl_no_such_module_xyz:score"),
        allowed_modules=["mrl_no_such_module_xyz"],
        import_executables=False,
    )
    with pytest.raises(WorkflowError):
        kit.build(_with_ref(kit, "mrl_no_such_module_xyz:score"), import_executables=False)


def test_resolve_executable_raises_workflow_error(user_module):
    with pytest.raises(WorkflowError) as info:
        resolve_executable("os:system", node_id="reward")
    assert info.value.node_id == "reward" and "outside the allowed modules" in str(info.value)


# -- built-in workflows ----------------------------------------------------------------------------------


def test_builtin_names_and_errors():
    assert builtin_names() == ("dapo", "grpo", "ppo", "reinforce_pp", "rloo")
    assert "dag_id: grpo" in builtin_workflow_text("grpo")
    with pytest.raises(NotFound) as info:
        builtin_workflow_text("grop")
    assert "did you mean 'grpo'?" in str(info.value)


@pytest.mark.parametrize("name", ["grpo", "ppo", "dapo", "reinforce_pp", "rloo"])
def test_builtins_load_and_follow_the_data_contract(name):
    wf = load_builtin(name)
    assert wf.dag_id == name
    types = [n.node_type for n in wf.nodes]
    assert types[:2] == [NodeType.DATA_LOAD, NodeType.ROLLOUT] and types[-1] == NodeType.MODEL_TRAIN
    assert all("outputs" in n.config or n.node_type == NodeType.MODEL_TRAIN for n in wf.nodes)
    assert load_workflow(name) == wf


def test_builtin_node_structure():
    grpo = load_builtin("grpo")
    assert {n.node_id: n.dependencies for n in grpo.nodes} == {
        "data_load": (),
        "rollout": ("data_load",),
        "reward": ("rollout",),
        "advantage": ("reward",),
        "old_logprob": ("rollout",),
        "ref_logprob": ("rollout",),
        "actor_train": ("advantage", "old_logprob", "ref_logprob"),
    }
    assert grpo.node("old_logprob").config["inputs"] == ["prompt_ids", "response_ids"]  # from the anchor
    ppo = load_builtin("ppo")
    assert ppo.node("advantage").config["estimator"] == "gae"
    assert [n.node_id for n in ppo.nodes if n.node_type == NodeType.MODEL_TRAIN] == ["actor_train", "critic_train"]
    dapo = load_builtin("dapo")
    assert dapo.node("dynamic_sampling").dependencies == ("reward",)
    assert dapo.node("old_logprob").dependencies == ("dynamic_sampling",)
    assert load_builtin("reinforce_pp").node("advantage").dependencies == ("reward", "old_logprob", "ref_logprob")
    assert [n.node_id for n in load_builtin("rloo").nodes] == [
        "data_load",
        "rollout",
        "reward",
        "advantage",
        "old_logprob",
        "actor_train",
    ]


def test_load_workflow_from_a_file(tmp_path, kit):
    path = tmp_path / "wf.yaml"
    path.write_text(kit.as_yaml(kit.chain()))
    assert load_workflow(path).node_ids[0] == "data"
    with pytest.raises(WorkflowError) as info:
        load_workflow(tmp_path / "missing.yaml")
    assert "does not exist" in str(info.value)
