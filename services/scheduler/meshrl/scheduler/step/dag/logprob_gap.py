"""The rollout-vs-trainer log-prob gap per version lag (`async/logprob_gap_lag<k>`): the trainer computes it in
the actor's old log-prob pass (meshrl.trainer.rollout_gap) from two more columns of the rows that pass reads
anyway, so the scheduler reads none of them. This module says which columns the pass also reads and names
the metrics it returns. Called by `NodeHandlers.inference` (step/dag/nodes.py).
"""

from __future__ import annotations

from meshrl.common import batch_schema as S
from meshrl.scheduler.step.dag.columns import column_reads
from meshrl.scheduler.step.dag.executor import StepContext
from meshrl.scheduler.workflow.columns import node_outputs
from meshrl.scheduler.workflow.model import Node

GAP_READS = (S.ROLLOUT_LOGPROBS, S.RESPONSE_VERSIONS)  # besides the pass's own old_logprobs
TRAINER_PREFIX = "logprob_gap_lag"  # the trainer's metric names: logprob_gap_lag<k>


def gap_reads(node: Node, ctx: StepContext) -> tuple[str, ...]:
    """The columns `node` (the actor's old log-prob pass) reads besides its inputs to report the gap: both when
    upstream batches write them, or when its rows are an asynchronous step's (one batch of the sample stream,
    which carries every generated column); none when no upstream node writes them (no gap to report)."""
    keys = ctx.input_keys(node.node_id)
    writes = node_outputs(ctx.nodes.values())
    if column_reads(keys, writes, GAP_READS) is not None:
        return GAP_READS
    stream_rows = bool(keys) and not any(k.node_id in writes for k in keys)
    return GAP_READS if stream_rows else ()


def gap_metric(name: str) -> str | None:
    """The step metric of a trainer metric that is a gap per lag (`async/logprob_gap_lag<k>`), else None."""
    return f"async/{name}" if name.startswith(TRAINER_PREFIX) else None
