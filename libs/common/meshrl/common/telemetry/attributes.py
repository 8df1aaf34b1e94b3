"""The span names and attribute keys every meshrl service agrees on.

The scheduler names step and node spans with these; services tag their spans with them; the
trace viewer (meshrl.scheduler.traceview) reads them back. Keep producers and readers on these
constants rather than string literals.
"""

from __future__ import annotations

STEP = "meshrl.step"  # int: the training step a span belongs to (set on the root `step N` span)
JOB_ID = "meshrl.job_id"  # str
NODE_ID = "meshrl.node_id"  # str: DAG node id (on `node <id>` spans)
NODE_TYPE = "meshrl.node_type"  # str: rollout, reward, advantage, ...
NODE_ROLE = "meshrl.node_role"  # str: actor, reference, critic, ...
REPLICA = "meshrl.replica"  # str: rollout engine replica id
BYTES = "meshrl.bytes"  # int: payload bytes read or written (data buffer, weights)
BUFFER_KEY = "meshrl.buffer.key"  # str: data-buffer key (job/step/node)
BUFFER_KEYS = "meshrl.buffer.keys"  # list[str]: the keys one GetSmallBatches call sent (BYTES: their sum)
REQUESTS = "meshrl.requests"  # int: generation requests in a call
TOKENS = "meshrl.tokens"  # int: tokens generated or processed
MICRO_BATCHES = "meshrl.micro_batches"  # int
PASSES = "meshrl.passes"  # int: forward passes one call made over its rows (Trainer.ComputeLogProbs more_passes)
WEIGHT_VERSION = "meshrl.weight_version"  # int
TRANSPORT = "meshrl.transport"  # str: weight transport, "disk" or "distributed"
APPLY_SECONDS = "meshrl.apply_seconds"  # float: seconds a rollout replica took to apply new weights

STEP_SPAN_PREFIX = "step "
NODE_SPAN_PREFIX = "node "


def step_span_name(step: int) -> str:
    """Name of the root span of one training step: `step N`."""
    return f"{STEP_SPAN_PREFIX}{step}"


def node_span_name(node_id: str) -> str:
    """Name of the span of one DAG node run: `node <node_id>`."""
    return f"{NODE_SPAN_PREFIX}{node_id}"
