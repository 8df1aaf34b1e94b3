"""How a node's input batches combine into one: each key listed once, the shards of one node concatenated in
shard order, then the nodes merged by column. Used by DataBufferClient.get_many after the reads."""

from __future__ import annotations

from collections.abc import Sequence

from meshrl.api.common.v1 import keys_pb2
from meshrl.common.codec import Batch, concat_batches, merge_batches
from meshrl.common.errors import InvalidArgument, NotFound


def refuse_repeated(keys: Sequence[keys_pb2.BatchKey]) -> None:
    """A key listed twice would be read twice and its rows concatenated (every column twice, trained twice)."""
    seen: set[bytes] = set()
    for i, key in enumerate(keys):
        raw = key.SerializeToString(deterministic=True)
        if raw in seen:
            shard = f", shard {key.shard}" if key.has_shard else ""
            raise InvalidArgument(
                f"input batch {i} (job {key.job_id!r}, step {key.step}, node {key.node_id!r}{shard}) is listed "
                "twice: each column must come from one batch; list each input key once",
                field="inputs",
            )
        seen.add(raw)


def combine_inputs(keys: Sequence[keys_pb2.BatchKey], batches: Sequence[Batch], columns: Sequence[str]) -> Batch:
    """The batches read for `keys` (same order) as one: shards of a node row-wise, nodes by column. With
    `columns`, a batch holding none of them is left out, and a column no batch holds is NotFound."""
    by_node: dict[tuple[str, int, str], list[tuple[int, Batch]]] = {}
    for key, batch in zip(keys, batches):
        by_node.setdefault((key.job_id, key.step, key.node_id), []).append((key.shard if key.has_shard else -1, batch))
    nodes = [concat_batches([b for _, b in sorted(parts, key=lambda p: p[0])]) for parts in by_node.values()]
    merged = merge_batches([b for b in nodes if b.columns or not columns])
    missing = [c for c in columns if c not in merged.columns]
    if missing:
        names = sorted({k.node_id for k in keys})
        raise NotFound(f"no input batch (of {names}) holds column {missing}; check the upstream nodes' outputs")
    return merged
