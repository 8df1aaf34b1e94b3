"""Log-prob nodes that share one trainer call (`Trainer.ComputeLogProbs` with `more_passes`): GRPO's
old_logprob and ref_logprob read the same rollout rows, so one call reads them once and runs both passes
back to back, where two calls read twice and each one's read and write competed with the other's pass.

Nodes share a call when the executor starts them together and one trainer serves them: MODEL_INFERENCE
log-prob nodes (actor or reference, not the critic) of one agent with the same dependencies, all run by this
walk of the DAG. The first of them to start makes the call (`StepContext.once`); the others wait for its
result, and each gets its own output key and metrics. Their rows come from the same rollouts, so the call
carries their one sampling temperature (step/scoring/temperature.py). Called by `NodeHandlers.inference`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshrl.api.common.v1 import keys_pb2
from meshrl.api.trainer.v1 import trainer_pb2 as tpb
from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.roles import role_proto
from meshrl.scheduler.clients import TrainerClient
from meshrl.scheduler.step.dag.columns import Reads
from meshrl.scheduler.step.dag.dispatch import handler_name
from meshrl.scheduler.step.dag.executor import NodeResult, StepContext
from meshrl.scheduler.step.dag.logprob_gap import gap_metric, gap_reads
from meshrl.scheduler.workflow.model import Node

ReadsOf = Callable[[Any, StepContext, list[str]], Reads]


def role_of(node: Node) -> str:
    return str(getattr(node.node_role, "value", node.node_role)).lower()


def _logprob_node(node: Node) -> bool:
    return handler_name(node) == "inference" and role_of(node) != "critic"


def call_group(node: Node, ctx: StepContext) -> list[Any]:
    """The nodes whose passes go in one call with `node`'s, in workflow order (just `node` when none)."""
    if not _logprob_node(node):
        return [node]
    deps = set(node.dependencies)
    return [
        n
        for i, n in ctx.nodes.items()
        if n is node
        or (i in ctx.scheduled and _logprob_node(n) and set(n.dependencies) == deps and n.agent == node.agent)
    ]


@dataclass(frozen=True)
class _Pass:
    node: Node
    role: str
    key: keys_pb2.BatchKey
    name: str
    gap: bool  # the actor's pi_old pass reports the rollout gap per version lag
    reads: Reads


def _plan(node: Node, ctx: StepContext, reads_of: ReadsOf) -> _Pass:
    role = role_of(node)
    name = node.config.get("output_name", S.OLD_LOGPROBS if role == "actor" else S.REF_LOGPROBS)
    gap = role == "actor" and name == S.OLD_LOGPROBS and ctx.version is not None
    reads = reads_of(node, ctx, gap_reads(node, ctx) if gap else [])
    return _Pass(node, role, batch_key(ctx.job_id, ctx.step, node.node_id), name, gap, reads)


def _union(reads: list[Reads]) -> Reads:
    keys = list({k.SerializeToString(deterministic=True): k for r in reads for k in r.keys}.values())
    every = any(not r.columns for r in reads)  # a pass that reads every column: the call does too
    return Reads(keys, [] if every else list(dict.fromkeys(c for r in reads for c in r.columns)))


def _result(p: _Pass, reply: Any) -> NodeResult:
    named = {k: (p.gap and gap_metric(k)) or f"{p.node.node_id}/{k}" for k in reply.metrics}
    return NodeResult([p.key], {named[k]: v for k, v in reply.metrics.items()})


def _call(trainer: TrainerClient, passes: list[_Pass], version: int | None, temperature: float | None) -> Any:
    """One ComputeLogProbs: the first pass's fields, the others as more_passes, the union of their reads."""
    first = passes[0]
    reads = _union([p.reads for p in passes])
    more = [
        tpb.LogProbPass(
            role=role_proto(p.role),
            output=p.key,
            with_entropy=p.role == "actor",
            output_name=p.name,
            weight_version=version if p.gap else None,
        )
        for p in passes[1:]
    ]
    return trainer.compute_logprobs(
        first.role,
        reads.keys,
        first.key,
        first.name,
        entropy=first.role == "actor",
        columns=reads.columns,
        weight_version=version if first.gap else None,
        more_passes=more,
        temperature=temperature,
    )


def run_passes(
    trainer: TrainerClient, nodes: list[Any], ctx: StepContext, reads_of: ReadsOf, temperature: float | None
) -> dict[str, NodeResult]:
    """Each node's result, from one call for all of them at the rows' sampling `temperature`."""
    passes = [_plan(n, ctx, reads_of) for n in nodes]
    reply = _call(trainer, passes, ctx.version, temperature)
    replies = [reply, *reply.passes]
    return {p.node.node_id: _result(p, r) for p, r in zip(passes, replies, strict=True)}
