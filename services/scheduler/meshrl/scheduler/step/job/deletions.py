"""A finished step's batches deleted off the critical path: the DeleteStep call of step N runs on a thread of
its own while step N+1 loads its prompts and generates, instead of between the two (1-2 ms of a 64-sample
step on a 2-core host, issue 21). Deletions run one at a time, in step order; the next one, and the end of
the steps, wait for the one before and raise its error, so a failed deletion still fails the job. Work that
writes under a finished step's keys (the held-out evaluation after step N uses step N's) calls `wait` first,
or the deletion under way could take its batches.

The job's bytes a deletion found (`buffer/bytes`) are reported with the step after it: they are the bytes
the job held when the previous step ended. Used by `step/job/runner.py` and `step/job/agent_runner.py`.
"""

from __future__ import annotations

import contextvars
from concurrent.futures import Future, ThreadPoolExecutor

from meshrl.common.databuffer_client import DataBufferClient, StepDeletion


class StepDeletions:
    def __init__(self, buffer: DataBufferClient, job_id: str, timeout: float = 60.0) -> None:
        self.buffer = buffer
        self.job_id = job_id
        self.timeout = timeout  # of one DeleteStep call
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="step-deletions")
        self._pending: Future[StepDeletion] | None = None
        self._report: dict[str, float] = {}  # the last finished deletion's metric, not yet reported

    def delete(self, step: int) -> dict[str, float]:
        """Starts deleting `step`'s batches; returns the previous deletion's `buffer/bytes` metric (none for a
        job's first step). Raises the previous deletion's error."""
        self.wait()
        report, self._report = self._report, {}
        run = contextvars.copy_context().run
        self._pending = self._pool.submit(run, self.buffer.delete_step, self.job_id, step, timeout=self.timeout)
        return report

    def wait(self) -> None:
        """Waits for the deletion under way (its metric goes out with the next `delete`); raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._report = {"buffer/bytes": float(pending.result().job_bytes_before)}

    def close(self) -> None:
        """Lets the deletion under way finish (its error is not raised: the steps already ended on one)."""
        self._pool.shutdown(wait=True)

    def __enter__(self) -> StepDeletions:
        return self

    def __exit__(self, exc_type, *_) -> None:
        """Steps that ended well wait for the last deletion (and raise its error); any end closes the pool."""
        try:
            if exc_type is None:
                self.wait()
        finally:
            self.close()
