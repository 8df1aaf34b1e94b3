"""Multi-agent workflows in-process: the agents of a workflow, what a job refuses (naming the node, the field
and the fix), and the routing of each node to its agent's handlers with its metrics under the agent's name."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from meshrl.scheduler.step.dag.agents import AgentHandlers, agent_problems, agents_of
from meshrl.scheduler.step.dag.dispatch import check_runnable
from meshrl.scheduler.step.dag.executor import NodeResult
from meshrl.scheduler.workflow import WorkflowError, load_workflow_text

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = (ROOT / "examples" / "hint_solve" / "workflow.yaml").read_text()
CONFIG = {"model": {"path": "unused"}, "data": {"train": "unused.jsonl"}}
ALLOWED = ["meshrl", "examples.hint_solve"]


def load(text: str):
    return load_workflow_text(text, CONFIG, allowed_modules=ALLOWED)


def example_with(change) -> str:
    doc = yaml.safe_load(EXAMPLE)
    change({n["node_id"]: n for n in doc["nodes"]}, doc)
    return yaml.safe_dump(doc)


def test_the_example_is_runnable_and_names_its_agents_in_order():
    wf = load(EXAMPLE)
    check_runnable(wf)
    assert agents_of(wf.nodes) == ["hinter", "solver"]


def _add_reference(n, doc):
    doc["nodes"].append(
        {
            "node_id": "solver_ref",
            "node_type": "MODEL_INFERENCE",
            "node_role": "REFERENCE",
            "dependencies": ["solver_rollout"],
            "config": {"agent": "solver", "inputs": ["prompt_ids", "response_ids"]},
        }
    )


def _drop_train(n, doc):
    doc["nodes"] = [x for x in doc["nodes"] if x["node_id"] != "solver_train"]


@pytest.mark.parametrize(
    ("change", "expected", "node"),
    [
        (lambda n, d: n["solver_rollout"]["config"].pop("agent"), "needs config.agent", "solver_rollout"),
        (_add_reference, "actor only, not REFERENCE", "solver_ref"),
        (
            lambda n, d: n["solver_rollout"].update(executable_ref="examples.hint_solve.agents:hand_over"),
            "multi-turn environments",
            "solver_rollout",
        ),
        (_drop_train, "agent 'solver' has no MODEL_TRAIN node", "solver_rollout"),
    ],
    ids=["model-node-without-agent", "reference-on-an-agent", "environment-on-an-agent", "agent-never-trained"],
)
def test_a_multi_agent_workflow_a_job_cannot_run_is_refused(change, expected, node):
    wf = load(example_with(change))
    problems = [p for p in agent_problems(wf.nodes) if expected in p.message]
    assert problems and problems[0].node_id == node and problems[0].fix
    with pytest.raises(WorkflowError, match=expected):
        check_runnable(wf)


def test_a_one_agent_workflow_has_no_agent_problems():
    wf = load(example_with(lambda n, d: [x.get("config", {}).pop("agent", None) for x in d["nodes"]]))
    assert agents_of(wf.nodes) == [] and agent_problems(wf.nodes) == []


class Handlers:
    def __init__(self, name: str) -> None:
        self.name = name

    def handler_for(self, node):
        return lambda n, ctx: NodeResult([], {"reward/mean": 1.0, "ran_on": self.name})


def test_each_node_runs_on_its_agents_handlers_and_logs_under_its_name():
    router = AgentHandlers({"hinter": Handlers("h"), "solver": Handlers("s")})
    solver = router.handler_for(SimpleNamespace(agent="solver"))(SimpleNamespace(agent="solver"), None)
    assert solver.metrics == {"solver/reward/mean": 1.0, "solver/ran_on": "s"}
    plain = router.handler_for(SimpleNamespace(agent=None))(SimpleNamespace(agent=None), None)
    assert plain.metrics == {"reward/mean": 1.0, "ran_on": "h"}  # no agent: the first agent's handlers
