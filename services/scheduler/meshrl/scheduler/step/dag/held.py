"""Columns the scheduler already holds in a step: what its own COMPUTE nodes (reward, advantage) wrote or
read this step, by the node whose batch they belong to. A later built-in COMPUTE node of the same step takes
them from here instead of reading them back from the data buffer; the reward node also reads, in its one
call, the columns its built-in successor needs from the same batches, so the advantage node reads nothing.

Only the built-in handlers use it (they never change the arrays they are given); a user COMPUTE node reads
the buffer as before. Called by `NodeHandlers` (step/dag/nodes.py); the store lives in `StepContext.held`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from meshrl.common.codec import Batch
from meshrl.scheduler.step.dag.columns import Reads, column_reads
from meshrl.scheduler.workflow import compute_catalog as cat
from meshrl.scheduler.workflow.columns import declared
from meshrl.scheduler.workflow.model import Node

Held = dict[str, dict[str, Any]]  # {node_id: {column: array or Ragged}}, whole rows of that node's batch(es)


def _writer(column: str, order: Sequence[str], writes: Mapping[str, frozenset[str]]) -> str | None:
    return next((nid for nid in order if column in writes.get(nid, ())), None)


def hold(held: Held, node_id: str, columns: Mapping[str, Any]) -> None:
    """Keeps the columns a node of this step wrote (or that were read from its batches)."""
    held.setdefault(node_id, {}).update(columns)


def read_held(buffer: Any, held: Held, reads: Reads, writes: Mapping[str, frozenset[str]]) -> Batch:
    """The columns of `reads`, each from the held columns of its writer when there, else read from the buffer
    (and then held). A read of every column (`reads.columns` empty) goes to the buffer and is not held."""
    if not reads.columns:
        return buffer.get_many(reads.keys)
    order = list(dict.fromkeys(k.node_id for k in reads.keys))
    have: dict[str, Any] = {}
    for column in reads.columns:
        writer = _writer(column, order, writes)
        if writer is not None and column in held.get(writer, {}):
            have[column] = held[writer][column]
    missing = [c for c in reads.columns if c not in have]
    if missing:
        sub = column_reads(reads.keys, writes, missing) or Reads(list(reads.keys), missing)
        batch = buffer.get_many(sub.keys, columns=sub.columns)
        sub_order = list(dict.fromkeys(k.node_id for k in sub.keys))
        for column in missing:
            have[column] = batch[column]
            writer = _writer(column, sub_order, writes)
            if writer is not None:
                hold(held, writer, {column: batch[column]})
    return Batch({c: have[c] for c in reads.columns})


def successor_reads(
    node: Node,
    nodes: Iterable[Node],
    sources: Sequence[str],
    writes: Mapping[str, frozenset[str]],
    local: Iterable[str],
) -> list[str]:
    """The declared inputs of `node`'s direct successors among the `local` node ids (the scheduler's built-in
    COMPUTE nodes) that come from the batches `node` reads (`sources`: their node ids), not from `node` itself."""
    local = set(local)
    mine = writes.get(node.node_id, frozenset())
    out: list[str] = []
    for succ in nodes:
        if succ.node_id not in local or node.node_id not in succ.dependencies or len(succ.dependencies) != 1:
            continue
        for column in declared(succ, cat.CONFIG_INPUTS) or []:
            if column not in mine and _writer(column, sources, writes) is not None:
                out.append(column)
    return list(dict.fromkeys(out))
