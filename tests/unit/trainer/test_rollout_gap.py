"""The rollout gap per version lag (meshrl.trainer.rollout_gap) from int32 token versions, as the replicas write
them, and from int64 ones, as batches written before the column narrowed hold them."""

import numpy as np
import pytest

from meshrl.common import batch_schema as S
from meshrl.common.codec import Ragged
from meshrl.trainer.rollout_gap import rollout_gap_metrics


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_the_gap_per_lag_reads_int32_and_older_int64_versions(dtype):
    offsets = np.array([0, 3, 5], dtype=np.int64)
    rollout = np.array([-1.0, -2.0, -3.0, -0.5, -0.25], dtype=np.float32)
    actor = np.array([-1.5, -2.0, -2.0, -0.5, -0.75], dtype=np.float32)
    versions = np.array([6, 7, 7, 6, 7], dtype=dtype)
    columns = {S.ROLLOUT_LOGPROBS: Ragged(rollout, offsets), S.RESPONSE_VERSIONS: Ragged(versions, offsets)}
    metrics = rollout_gap_metrics(columns, actor, weight_version=7)
    assert metrics["logprob_gap_lag0"] == pytest.approx((0.0 + 1.0 + 0.5) / 3)
    assert metrics["logprob_gap_lag1"] == pytest.approx((0.5 + 0.0) / 2)
    assert metrics["logprob_mismatch_max"] == pytest.approx(1.0)
