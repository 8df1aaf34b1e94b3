"""The step dispatch table: it covers every (type, role) the validator accepts (or names it plan-only), and a
job refuses what no handler would honour — plan-only nodes, multi-agent nodes, config keys nobody reads —
instead of ignoring it. Node settings that are accepted reach the service call (top_p, only_forward_compute)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from meshrl.common.batch_key import batch_key
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.step.dag.dispatch import CONFIG_KEYS, DISPATCH, PLAN_ONLY, check_dispatch_table, handler_name
from meshrl.scheduler.step.dag.executor import NodeResult, StepContext
from meshrl.scheduler.step.dag.nodes import NodeHandlers
from meshrl.scheduler.workflow import ROLES_BY_TYPE, WorkflowError, builtin_workflow_text, load_workflow_text

CONFIG = {"model": {"path": "unused"}, "data": {"train": "unused.jsonl"}}


def grpo_with(change) -> str:
    """The built-in GRPO workflow with `change(nodes_by_id)` applied."""
    doc = yaml.safe_load(builtin_workflow_text("grpo"))
    doc.pop("x-policy-forward", None)
    change({n["node_id"]: n for n in doc["nodes"]})
    return yaml.safe_dump(doc)


def test_the_table_covers_what_the_validator_accepts():
    check_dispatch_table()
    declared = {(t, r) for t, roles in ROLES_BY_TYPE.items() for r in roles}
    assert set(DISPATCH) | set(PLAN_ONLY) == declared and not set(DISPATCH) & set(PLAN_ONLY)
    assert set(CONFIG_KEYS) | {"user_compute"} == set(DISPATCH.values())
    for method in DISPATCH.values():
        assert callable(getattr(NodeHandlers, method))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda n: n["old_logprob"].update(node_role="REWARD"), "config.model_path: Field required"),
        (lambda n: n["rollout"]["config"].update(agent="a"), "config.agent"),
        (lambda n: n["rollout"]["config"].update(topp=0.9), "did you mean 'top_p'"),
        (lambda n: n["actor_train"]["config"].update(estimator="grpo"), "config.estimator is read by nothing"),
        (lambda n: n["rollout"]["config"].update(max_turns=3), "config.max_turns limits multi-turn episodes"),
    ],
    ids=[
        "reward-model-without-model",
        "multi-agent",
        "misspelt-key",
        "key-of-another-node",
        "episode-limit-without-env",
    ],
)
def test_a_job_refuses_what_it_would_ignore(tmp_path, change, expected):
    text = grpo_with(change)
    load_workflow_text(text, CONFIG)  # valid for `meshrl plan`
    jobs = JobManager(str(tmp_path), 1)
    with pytest.raises(WorkflowError, match=expected):
        jobs.create(text, yaml.safe_dump(CONFIG), [])
    assert not list(tmp_path.iterdir())  # nothing was written for the refused job


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return ([], {}) if name == "generate" else SimpleNamespace(metrics={}, passes=[])

        return record


def _run_node(text: str, node_id: str, rows: int | None = None):
    """Runs one node's handler after every node before it "ran" (wrote one batch; `rows` rows each)."""
    wf = load_workflow_text(text, CONFIG)
    trainer, fleet = Recorder(), Recorder()
    cfg = JobConfig.model_validate(CONFIG)
    handlers = NodeHandlers(cfg, None, trainer, fleet, None, None, None)
    ctx = StepContext("j", 1, nodes={n.node_id: n for n in wf.nodes})
    for n in wf.nodes:
        if n.node_id == node_id:
            break
        ctx.results[n.node_id] = NodeResult(
            [batch_key("j", 1, n.node_id)], rewrites_rows=n.node_id == "rollout", rows=rows
        )
    node = ctx.nodes[node_id]
    handlers.handler_for(node)(node, ctx)
    return trainer.calls, fleet.calls


def test_the_rollout_gets_the_prompt_count_from_data_load_and_its_declared_columns():
    _, fleet = _run_node(builtin_workflow_text("grpo"), "rollout", rows=24)
    ((_, _, kwargs),) = fleet
    assert kwargs["num_prompts"] == 24 and list(kwargs["columns"]) == ["prompt_ids", "answer"]


def test_a_trainer_node_reads_its_declared_columns_from_the_nodes_that_write_them():
    trainer, _ = _run_node(builtin_workflow_text("grpo"), "actor_train")
    ((name, args, kwargs),) = trainer
    assert name == "train_step"
    assert kwargs["columns"] == ["prompt_ids", "response_ids", "advantages", "old_logprobs", "ref_logprobs"]
    # reward writes none of them: its batch is not read; data_load is past the rollout (which rewrites rows)
    assert [k.node_id for k in args[1]] == ["advantage", "old_logprob", "ref_logprob", "rollout"]


def test_a_rollout_nodes_top_p_reaches_the_fleet():
    _, fleet = _run_node(grpo_with(lambda n: n["rollout"]["config"].update(top_p=0.7)), "rollout")
    ((name, _, kwargs),) = fleet
    assert name == "generate" and kwargs["top_p"] == 0.7


def test_only_forward_compute_runs_a_forward_pass_and_no_optimizer_step():
    text = grpo_with(lambda n: n["actor_train"].update(only_forward_compute=True))
    node = {n.node_id: n for n in load_workflow_text(text, CONFIG).nodes}["actor_train"]
    assert handler_name(node) == "inference"
    trainer, _ = _run_node(text, "actor_train")
    assert [name for name, _, _ in trainer] == ["compute_logprobs"]
