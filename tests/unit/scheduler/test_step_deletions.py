"""A finished step's batches deleted off the critical path (step/job/deletions.py), against a real data buffer
service: deletions run in step order, each reports the job's bytes with the next step, and a failed one
fails the next step instead of being lost."""

from __future__ import annotations

import numpy as np
import pytest

from meshrl.common.batch_key import batch_key
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.common.errors import MeshrlError
from meshrl.common.net import free_port
from meshrl.scheduler.step.job.deletions import StepDeletions
from tests._databuffer import served_client


@pytest.fixture()
def buffer():
    with served_client("deletions") as client:
        yield client


def test_each_step_is_deleted_in_the_background_and_its_bytes_come_with_the_next(buffer):
    for step in (1, 2):
        buffer.put(batch_key("job", step, "rollout"), {"x": np.arange(256, dtype=np.float32)})
    deletions = StepDeletions(buffer, "job")
    try:
        assert deletions.delete(1) == {}  # nothing before the first step
        second = deletions.delete(2)  # waits for step 1's deletion, which found both steps' batches
        assert second["buffer/bytes"] >= 2 * 256 * 4
        deletions.wait()
        assert buffer.list("job", 1) == [] and buffer.list("job", 2) == []
        third = deletions.delete(3)  # step 2's figure, although its deletion was waited for apart
        assert third == {"buffer/bytes": pytest.approx(second["buffer/bytes"] / 2, rel=0.5)}
    finally:
        deletions.close()


def test_a_batch_written_under_a_step_after_waiting_survives_its_deletion(buffer):
    """The held-out evaluation after step N writes under step N's keys: after `wait`, nothing takes them."""
    buffer.put(batch_key("job", 1, "rollout"), {"x": np.arange(4, dtype=np.float32)})
    deletions = StepDeletions(buffer, "job")
    try:
        deletions.delete(1)
        deletions.wait()
        buffer.put(batch_key("job", 1, "eval_prompts"), {"x": np.arange(4, dtype=np.float32)})
        assert [k.node_id for k in buffer.list("job", 1)] == ["eval_prompts"]
    finally:
        deletions.close()


def test_a_failed_deletion_fails_the_next_step():
    gone = DataBufferClient(f"127.0.0.1:{free_port()}")  # nothing listens there
    deletions = StepDeletions(gone, "job", timeout=2.0)
    try:
        assert deletions.delete(1) == {}
        with pytest.raises(MeshrlError):  # Unavailable or DeadlineExceeded
            deletions.delete(2)
    finally:
        deletions.close()
        gone.close()
