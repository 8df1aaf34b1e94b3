"""What a node reads from the data buffer in a step: exactly the columns its workflow `inputs:` name, each
from the nearest upstream batch that writes it (the keys of upstream nodes that write none of them are
not read at all). A node without `inputs:` reads every column of every upstream batch, as before.

Called by the node handlers (step/dag/nodes.py) for the scheduler's own reads and for the column lists it
sends the trainer and the rollout replicas; which node writes which column comes from
`meshrl.scheduler.workflow.columns` (declared `outputs:`, else the built-in's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshrl.api.common.v1 import keys_pb2
from meshrl.scheduler.workflow import compute_catalog as cat
from meshrl.scheduler.workflow.columns import declared
from meshrl.scheduler.workflow.model import Node


@dataclass(frozen=True)
class Reads:
    keys: list[keys_pb2.BatchKey]  # the upstream batches to read, nearest first
    columns: list[str]  # the columns to read from them; [] = every column


def plan_reads(
    node: Node, keys: Sequence[keys_pb2.BatchKey], writes: Mapping[str, frozenset[str]], also: Sequence[str] = ()
) -> Reads:
    """The reads of `node` from the upstream `keys` (nearest first, as `StepContext.input_keys` gives them).
    `writes`: {node_id: columns it writes}; `also`: columns read besides the declared inputs (a row filter
    passes its declared outputs through)."""
    inputs = declared(node, cat.CONFIG_INPUTS)
    if not inputs:
        return Reads(list(keys), [])
    columns = list(dict.fromkeys([*inputs, *also]))
    # no upstream node says it writes one of them: read everything, the buffer names what is missing
    return column_reads(keys, writes, columns) or Reads(list(keys), columns)


def column_reads(
    keys: Sequence[keys_pb2.BatchKey], writes: Mapping[str, frozenset[str]], columns: Sequence[str]
) -> Reads | None:
    """`columns`, each from the nearest of the upstream `keys` whose node writes it; None when no upstream
    node writes one of them (nothing to read for a reader that needs them all)."""
    order = list(dict.fromkeys(k.node_id for k in keys))
    sources: set[str] = set()
    for col in columns:
        writer = next((nid for nid in order if col in writes.get(nid, ())), None)
        if writer is None:
            return None
        sources.add(writer)
    return Reads([k for k in keys if k.node_id in sources], list(columns))
