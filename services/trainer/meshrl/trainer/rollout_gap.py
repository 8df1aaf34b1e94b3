"""How far the rollout engine's token log-probs are from the actor's own for the same tokens, reported with
the actor's log-prob pass (TrainerService.compute_logprobs), so the scheduler reads none of these columns:
the mismatch over every model token, and the gap per version lag (the weights' version minus the version
that generated the token), which the scheduler reports as `async/logprob_gap_lag<k>`. No gRPC imports.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from meshrl.common import batch_schema as S


def rollout_gap_metrics(
    columns: Mapping[str, object], logprobs: np.ndarray, weight_version: int | None
) -> dict[str, float]:
    """`columns`: the rows read (rollout_logprobs, and response_versions / loss_mask where present);
    `logprobs`: the actor's log-prob of every response token, float [T], in the rows' token order.
    Empty when the rows carry no rollout log-probs of the same tokens."""
    rollout = columns.get(S.ROLLOUT_LOGPROBS)
    if rollout is None or rollout.values.size != logprobs.size or not logprobs.size:
        return {}
    gap = np.abs(np.asarray(rollout.values, np.float64) - np.asarray(logprobs, np.float64))
    metrics: dict[str, float] = {}
    versions = columns.get(S.RESPONSE_VERSIONS)
    if weight_version is not None and versions is not None and versions.values.size == gap.size:
        # every token, in the columns' own dtype (float32), as the scheduler computed it from the batches
        token_gap = np.abs(np.asarray(logprobs) - np.asarray(rollout.values))
        lag = weight_version - np.asarray(versions.values, np.int64)  # int32 (int64 in older batches)
        metrics.update({f"logprob_gap_lag{int(v)}": float(token_gap[lag == v].mean()) for v in np.unique(lag)})
    loss_mask = columns.get(S.LOSS_MASK)
    if loss_mask is not None and loss_mask.values.size == gap.size:  # model tokens only (multi-turn)
        gap = gap[np.asarray(loss_mask.values) > 0]
    if gap.size:
        metrics["logprob_mismatch_mean"] = float(gap.mean())
        metrics["logprob_mismatch_max"] = float(gap.max())
    return metrics
