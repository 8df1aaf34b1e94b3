"""The temperature a trainer call's rows were sampled at: the ROLLOUT node upstream of a log-prob or train
node samples at its own `temperature` (or `rollout.temperature`), and the trainer must divide the logits by
the same number, or pi, pi_old and the rollout's log-probs are three different distributions. Checked when a
job is created (`check_temperatures`, called by `JobManager.create`), sent with every ComputeLogProbs and
TrainStep (`NodeHandlers.inference` / `train`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.workflow import NodeType
from meshrl.scheduler.workflow.model import Node

GREEDY_LOGPROBS = 1.0  # a greedy engine (temperature 0) reports log_softmax of the raw logits


def _rollout_ancestors(node: Node, by_id: dict[str, Any]) -> list[Any]:
    """The ROLLOUT nodes `node` depends on, directly or through other nodes, in workflow order."""
    seen: set[str] = set()
    todo = list(node.dependencies)
    while todo:
        dep = todo.pop()
        if dep in seen or dep not in by_id:
            continue
        seen.add(dep)
        todo.extend(by_id[dep].dependencies)
    return [n for i, n in by_id.items() if i in seen and n.node_type == NodeType.ROLLOUT]


def sampled_at(node: Node, default: float) -> float:
    """The temperature whose log-probs a ROLLOUT node's engine reports (its config's, else `default`)."""
    temperature = float(node.config.get("temperature", default))
    return temperature if temperature > 0 else GREEDY_LOGPROBS


def sampling_temperature(node: Node, nodes: Iterable[Node], default: float) -> float | None:
    """The temperature of the rows `node` reads: its upstream ROLLOUT nodes' (None when it has none, e.g. a
    supervised node: the trainer then uses the model's own distribution). `default`: `rollout.temperature`."""
    by_id = {n.node_id: n for n in nodes}
    rollouts = _rollout_ancestors(node, by_id)
    temps = {r.node_id: sampled_at(r, default) for r in rollouts}
    if len(set(temps.values())) > 1:
        raise InvalidArgument(
            f"node {node.node_id!r} reads rows sampled at different temperatures ({temps}); its log-probs are taken "
            "at one. Fix: give those ROLLOUT nodes the same temperature (or unset it to use rollout.temperature)",
            field="rollout.temperature",
        )
    return next(iter(temps.values()), None)


def check_temperatures(nodes: Iterable[Node], default: float) -> None:
    """Refuses, when a job is created, a model node whose rows come from rollouts at different temperatures."""
    nodes = list(nodes)
    for node in nodes:
        if node.node_type in (NodeType.MODEL_INFERENCE, NodeType.MODEL_TRAIN):
            sampling_temperature(node, nodes, default)
