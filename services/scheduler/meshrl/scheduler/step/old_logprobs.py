"""Where the actor's pi_old comes from (`algorithm.loss.old_logprobs`), as the step sees it: which columns a
train node reads besides its declared inputs for the ratio and its corrections (`ratio_reads`), and the check
made when a job is created that a workflow does not also compute old log-probs that the loss would ignore
(`check_old_logprobs`).

'recompute' (the trainer's default) reads `old_logprobs`, written by an actor MODEL_INFERENCE node (a trainer
forward pass before the update); 'rollout' reads the engine's own `rollout_logprobs` instead and needs no such
node, which saves a forward pass over every sample per step. The trainer owns the setting's meaning
(`meshrl.trainer.losses.LossConfig`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshrl.common import batch_schema as S
from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.workflow import NodeRole, NodeType
from meshrl.scheduler.workflow.columns import declared


def ratio_reads(loss: Mapping[str, Any]) -> list[str]:
    """Columns the actor's train step needs besides its declared inputs: the rollout's log-probs, when the
    loss corrects against them (tis_cap / mis_cap) or takes pi_old from them."""
    uses_rollout = loss.get("tis_cap") or loss.get("mis_cap") or loss.get("old_logprobs") == "rollout"
    return [S.ROLLOUT_LOGPROBS] if uses_rollout else []


def check_old_logprobs(cfg: Any, nodes: list[Any]) -> None:
    """Refuses (INVALID_ARGUMENT, nothing created) an actor train node that declares `old_logprobs` as an input
    when `algorithm.loss.old_logprobs` is 'rollout': the loss would not read them, and the forward pass that
    writes them would be wasted."""
    if cfg.algorithm.loss.old_logprobs != "rollout":
        return
    for node in nodes:
        trains_actor = node.node_type == NodeType.MODEL_TRAIN and node.node_role == NodeRole.ACTOR
        if trains_actor and S.OLD_LOGPROBS in (declared(node, "inputs") or []):
            raise InvalidArgument(
                f"node {node.node_id!r} declares {S.OLD_LOGPROBS!r} as an input, but algorithm.loss.old_logprobs = "
                f"'rollout' takes pi_old from {S.ROLLOUT_LOGPROBS!r}. Fix: drop {S.OLD_LOGPROBS} from its inputs "
                "(and the actor MODEL_INFERENCE node that writes them), or set algorithm.loss.old_logprobs: recompute"
            )
