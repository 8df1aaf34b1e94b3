"""Multi-agent workflows: which agents a workflow has, what a multi-agent job supports (and the clear refusal
of the rest), and the routing of each node to the services of its agent.

Design: every agent is a policy of its own: its own trainer process (role actor), its own rollout replicas,
its own weights folder and weight version (`step/job/agent_runner.py` starts and publishes them). A node names its
agent with `config.agent`; ROLLOUT and MODEL_* nodes must, COMPUTE nodes may (their metrics are then logged
under the agent's name, e.g. `solver/reward/mean`), and nodes without one (data load, hand-offs between agents)
run on the first agent's handlers, which need no model for them. Agents generate in turn through the DAG: a
COMPUTE node (executable_ref) turns one agent's samples into the next agent's prompts.
Called by `step/dag/dispatch.py` (workflow problems), `jobs.py` (job-config problems) and `step/job/agent_runner.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.step.dag.executor import NodeResult, StepContext
from meshrl.scheduler.workflow import NodeRole, NodeType, Problem
from meshrl.scheduler.workflow.model import Node

MODEL_TYPES = (NodeType.ROLLOUT, NodeType.MODEL_INFERENCE, NodeType.MODEL_TRAIN)


def agents_of(nodes: list[Any]) -> list[str]:
    """The workflow's agents in order of first appearance ([] for a one-agent workflow)."""
    return list(dict.fromkeys(n.agent for n in nodes if n.agent is not None))


def agent_problems(nodes: list[Any]) -> list[Problem]:
    """What a multi-agent job would not run as written: a model node without an agent, an agent without a
    trained actor, roles other than the actor's, environments and reward models."""
    agents = agents_of(nodes)
    if not agents:
        return []
    problems: list[Problem] = []
    for n in nodes:
        if n.node_type in MODEL_TYPES and n.agent is None:
            problems.append(
                Problem(
                    f"a multi-agent workflow (agents {agents}) needs config.agent on every ROLLOUT and MODEL_* node",
                    f"set config.agent to one of {agents}",
                    n.node_id,
                    "config.agent",
                )
            )
        if n.agent is not None and n.node_type in MODEL_TYPES[1:] and n.node_role != NodeRole.ACTOR:
            problems.append(
                Problem(
                    f"agent nodes train and score the agent's actor only, not {n.node_role.value}",
                    "use node_role ACTOR (no reference, critic or reward model per agent: rule "
                    "rewards in COMPUTE REWARD nodes)",
                    n.node_id,
                    "node_role",
                )
            )
        if n.agent is not None and n.node_type == NodeType.ROLLOUT and n.executable_ref:
            problems.append(
                Problem(
                    "multi-turn environments are not run in multi-agent workflows yet",
                    "generate single turns per agent, and hand one agent's samples to the next with a COMPUTE node",
                    n.node_id,
                    "executable_ref",
                )
            )
    trained = {n.agent for n in nodes if n.node_type == NodeType.MODEL_TRAIN and n.node_role == NodeRole.ACTOR}
    for agent in agents:
        if agent not in trained:
            first = next(n.node_id for n in nodes if n.agent == agent)
            problems.append(
                Problem(
                    f"agent {agent!r} has no MODEL_TRAIN node of role ACTOR: its policy would never change",
                    f"add a MODEL_TRAIN / ACTOR node with config.agent: {agent}",
                    first,
                    "config.agent",
                )
            )
    return problems


def check_agent_job(cfg: Any, nodes: list[Any], resume: bool = False) -> None:
    """Refuses (INVALID_ARGUMENT, nothing created) job settings a multi-agent job does not support."""
    agents = agents_of(nodes)
    if not agents:
        return
    unsupported = [
        (cfg.training.mode != "sync", f"training.mode = {cfg.training.mode!r}", "use training.mode: sync"),
        (bool(cfg.warmup.steps or cfg.warmup.epochs), "a supervised warm-up", "set warmup.steps and epochs to 0"),
        (bool(cfg.checkpoint.every), "checkpoints (checkpoint.every)", "set checkpoint.every: 0"),
        (resume, "resuming a run", "start a new run"),
        (cfg.trainer.address is not None, "trainer.address", "let the job start one trainer per agent"),
        (
            bool(cfg.rollout.addresses) or cfg.rollout.registry.redis_url is not None,
            "rollout.addresses / rollout.registry",
            "let the job start each agent's replicas",
        ),
        (cfg.weights.transport != "disk", f"weights.transport = {cfg.weights.transport!r}", "use transport: disk"),
        (
            bool(cfg.data.eval),
            "a held-out evaluation (data.eval)",
            "remove data.eval (each agent's reward is logged per step)",
        ),
        (
            cfg.services.placement == "colocated",
            "services.placement = 'colocated'",
            "use placement: disaggregated (each agent has its own trainer and replicas)",
        ),
    ]
    for bad, what, fix in unsupported:
        if bad:
            raise InvalidArgument(f"a multi-agent job (agents {agents}) does not support {what}. Fix: {fix}")


class AgentHandlers:
    """Routes each node to the NodeHandlers of its agent (nodes without one: the first agent's); the metrics
    of an agent's nodes are prefixed with its name, so both agents' rewards and losses are logged."""

    def __init__(self, by_agent: Mapping[str, Any]) -> None:
        self.by_agent = dict(by_agent)
        self.default = next(iter(self.by_agent.values()))

    def handler_for(self, node: Node) -> Callable[[Any, StepContext], NodeResult]:
        handlers = self.by_agent[node.agent] if node.agent is not None else self.default
        handler = handlers.handler_for(node)
        if node.agent is None:
            return handler

        def run(n: Any, ctx: StepContext) -> NodeResult:
            result = handler(n, ctx)
            result.metrics = {f"{n.agent}/{k}": v for k, v in result.metrics.items()}
            return result

        return run
