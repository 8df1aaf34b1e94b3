"""Where a workflow's DAG splits for asynchronous training (`training.mode` one_step_off / async): the
producer side is every node that needs no trainer model (data load, rollout, and COMPUTE nodes such as the
reward that depend only on those), the consumer side is the rest (log-probs, advantages that read them,
training). Within the producer, generation (the ROLLOUT nodes and what they depend on) is told apart from the
nodes after it, which finish a round while the next one generates. The boundary nodes are the producer nodes the consumer reads from; their rows travel through the
data buffer's sample stream. Called by `meshrl.scheduler.step.pacing.pipeline` and checked when a job is created.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.step.dag.nodes import enum_name
from meshrl.scheduler.workflow import NodeType
from meshrl.scheduler.workflow.model import Node

TRAINER_TYPES = (NodeType.MODEL_INFERENCE, NodeType.MODEL_TRAIN)


@dataclass(frozen=True)
class Split:
    producer: frozenset[str]  # run by the producer, once per round
    consumer: frozenset[str]  # run by the step loop, once per step
    boundary: tuple[str, ...]  # producer nodes a consumer node depends on (their rows go through the stream)
    rollout: tuple[str, ...]  # the ROLLOUT nodes (their time is the rollout's busy time)
    trainer: tuple[str, ...]  # MODEL_* nodes (their time is the trainer's busy time)
    generation: frozenset[str] = frozenset()  # the ROLLOUT nodes and the producer nodes they depend on

    @property
    def finish(self) -> frozenset[str]:
        """The producer nodes after generation (reward, ...): run while the next round generates."""
        return self.producer - self.generation


def _type(node: Node) -> NodeType:
    return NodeType(enum_name(node.node_type))


def node_kinds(nodes: list[Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(ROLLOUT node ids, MODEL_* node ids) of a DAG."""
    rollout = tuple(n.node_id for n in nodes if _type(n) == NodeType.ROLLOUT)
    trainer = tuple(n.node_id for n in nodes if _type(n) in TRAINER_TYPES)
    return rollout, trainer


def split_at_rollout(nodes: list[Any]) -> Split:
    """Splits the DAG at the rollout -> learner boundary; refuses (InvalidArgument) a DAG that cannot run
    asynchronously: no ROLLOUT node, a ROLLOUT that needs a trainer model, or nothing left to train."""
    by_id = {n.node_id: n for n in nodes}
    needs_trainer: dict[str, bool] = {}

    def trainer_bound(node_id: str) -> bool:
        if node_id not in needs_trainer:
            node = by_id[node_id]
            needs_trainer[node_id] = _type(node) in TRAINER_TYPES or any(trainer_bound(d) for d in node.dependencies)
        return needs_trainer[node_id]

    producer = frozenset(i for i in by_id if not trainer_bound(i))
    consumer = frozenset(by_id) - producer
    rollout, trainer = node_kinds(nodes)
    fix = "use training.mode: sync for this workflow"
    if not rollout:
        raise InvalidArgument(f"training.mode async/one_step_off needs a ROLLOUT node; the workflow has none; {fix}")
    late = [i for i in rollout if i not in producer]
    if late:
        raise InvalidArgument(
            f"ROLLOUT node(s) {late} depend on a trainer model node, so generation cannot run ahead of training; {fix}"
        )
    if not consumer:
        raise InvalidArgument(f"the workflow has no MODEL_INFERENCE / MODEL_TRAIN node to consume samples; {fix}")
    boundary = tuple(i for i in by_id if i in producer and any(i in by_id[c].dependencies for c in consumer))
    generation: set[str] = set()
    stack = list(rollout)
    while stack:
        node_id = stack.pop()
        if node_id not in generation:
            generation.add(node_id)
            stack += by_id[node_id].dependencies
    return Split(producer, consumer, boundary, rollout, trainer, frozenset(generation))


@dataclass(frozen=True)
class AsyncPlan:
    split: Split
    eta: int  # max_staleness
    stream_groups: int  # most unconsumed groups in the stream (back-pressure)
    round_groups: int  # groups (prompts) one round generates
    stale_policy: str = "drop"  # a group older than eta: "drop" (counted) or "regenerate" (its prompt put back)
    data_node: str = ""  # the one DATA_LOAD node: its prompt_index names each group's prompt ("" if not one)


def plan_async(training: Any, prompts_per_step: int, nodes: list[Any]) -> AsyncPlan:
    """The asynchronous plan of a job's `training` section over its DAG; refuses (InvalidArgument) what
    cannot run: a DAG that does not split, or a stream bound below one round."""
    split = split_at_rollout(nodes)
    loads = [n for n in nodes if _type(n) == NodeType.DATA_LOAD]
    round_groups = max([int(n.config.get("prompts_per_step", prompts_per_step)) for n in loads] or [1])
    bound = training.stream_groups or (training.staleness + 1) * round_groups
    if bound < round_groups:
        raise InvalidArgument(
            f"training.stream_groups = {training.stream_groups} is below one step's {round_groups} groups "
            f"(data.prompts_per_step): generation could never start; use at least {round_groups} or 0 (automatic)"
        )
    data_node = loads[0].node_id if len(loads) == 1 and loads[0].node_id in split.producer else ""
    policy = training.stale_policy
    if policy == "regenerate" and not data_node:
        raise InvalidArgument(
            f"training.stale_policy = 'regenerate' puts a stale group's prompt back to the data loader, which needs "
            f"exactly one DATA_LOAD node on the producer side (the workflow has {len(loads)}); use stale_policy: drop"
        )
    return AsyncPlan(split, training.staleness, bound, round_groups, policy, data_node)
