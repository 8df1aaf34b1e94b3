"""Where the actor's pi_old comes from (`algorithm.loss.old_logprobs`), as the step sees it: the choice made
for a job that leaves it unset (`resolve_old_logprobs`), which columns a train node reads besides its declared
inputs for the ratio and its corrections (`ratio_reads`), and the check that a workflow does not also compute
old log-probs that the loss would ignore. Called by `Jobs.create` (jobs.py) and `NodeHandlers.train`.

'recompute' (the trainer's default) reads `old_logprobs`, written by an actor MODEL_INFERENCE node (a trainer
forward pass before the update); 'in-train' makes the same pass inside the train call, so no column travels
through the data buffer; 'rollout' reads the engine's own `rollout_logprobs` and needs no pass at all, which
saves a forward pass over every sample per step — exact for on-policy samples, but on stale samples (one_step_off,
async) pi_old is then the behaviour policy and no importance weight can correct it, so those modes resolve an
unset choice to 'in-train'; 'interpolated' needs no pass either and approximates the in-train pass per token
from `rollout_logprobs`, the current policy and `response_versions` (AReaL's proximal approximation). The trainer owns the setting's meaning (`meshrl.trainer.losses.LossConfig`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from meshrl.common import batch_schema as S
from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.workflow import NodeRole, NodeType
from meshrl.scheduler.workflow.columns import declared
from meshrl.scheduler.workflow.model import Node


def ratio_reads(loss: Mapping[str, object]) -> list[str]:
    """Columns the actor's train step needs besides its declared inputs: the rollout's log-probs, when the
    loss corrects against them (tis_cap / mis_cap) or takes pi_old from them, and the tokens' versions when
    pi_old or the step size follows their lag (interpolated, lag_lr_scale)."""
    source = loss.get("old_logprobs")
    uses_rollout = loss.get("tis_cap") or loss.get("mis_cap") or source in ("rollout", "interpolated")
    versions = [S.RESPONSE_VERSIONS] if source == "interpolated" or loss.get("lag_lr_scale") else []
    return [S.ROLLOUT_LOGPROBS, *versions] if uses_rollout else versions


def _trains_actor(node: Node) -> bool:
    return node.node_type == NodeType.MODEL_TRAIN and node.node_role == NodeRole.ACTOR


def _reads_old_logprobs(nodes: Sequence[Node]) -> list[Node]:
    """The actor train nodes that declare `old_logprobs` as an input."""
    return [node for node in nodes if _trains_actor(node) and S.OLD_LOGPROBS in (declared(node, "inputs") or [])]


def resolve_old_logprobs(cfg: JobConfig, nodes: Sequence[Node]) -> None:
    """Sets an unset `algorithm.loss.old_logprobs` to what fits the workflow and the training mode, then checks
    the result (INVALID_ARGUMENT, nothing created):

    - a workflow whose actor train node reads `old_logprobs` (an old log-prob node writes them): 'recompute';
    - otherwise, `sync` with no importance-weight cap: 'rollout' (on-policy samples: the engine's log-probs are
      pi_old, and the step saves a forward pass);
    - otherwise (one_step_off / async, or a tis_cap / mis_cap set): 'in-train', so the samples' behaviour
      policy (the rollout's log-probs) and pi_old differ and the caps correct the staleness (decoupled PPO).
    """
    loss = cfg.algorithm.loss
    readers = _reads_old_logprobs(nodes)
    if loss.old_logprobs is None:
        on_policy = cfg.training.mode == "sync" and not (loss.tis_cap or loss.mis_cap)
        loss.old_logprobs = "recompute" if readers else "rollout" if on_policy else "in-train"
    if loss.old_logprobs != "recompute" and readers:
        source = {
            "rollout": S.ROLLOUT_LOGPROBS,
            "interpolated": f"{S.ROLLOUT_LOGPROBS} and the current policy by version lag",
        }.get(loss.old_logprobs, "the train call's own forward pass")
        raise InvalidArgument(
            f"node {readers[0].node_id!r} declares {S.OLD_LOGPROBS!r} as an input, but algorithm.loss.old_logprobs "
            f"= {loss.old_logprobs!r} takes pi_old from {source}. Fix: drop {S.OLD_LOGPROBS} from its inputs "
            "(and the actor MODEL_INFERENCE node that writes them), or set algorithm.loss.old_logprobs: recompute"
        )
    if loss.old_logprobs == "recompute" and not readers and any(_trains_actor(n) for n in nodes):
        raise InvalidArgument(
            f"algorithm.loss.old_logprobs = 'recompute' reads {S.OLD_LOGPROBS!r}, but no actor MODEL_TRAIN node "
            f"declares it as an input, so every ratio would be taken against the weights of its own mini-batch. "
            f"Fix: set old_logprobs: in-train (the train call computes pi_old) or rollout, or add an actor "
            f"MODEL_INFERENCE node writing {S.OLD_LOGPROBS} and declare it in the train node's inputs"
        )
