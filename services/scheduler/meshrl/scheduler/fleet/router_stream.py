"""One response at a time through the rollout router (multi-turn episodes, interactive use): a stream kept on
its session's replica, retried on another replica until its first chunk arrived, and refused from a replica
whose weights are older than the router's floor (`min_version`), as `RolloutRouter.generate_batch` does. A
replica whose stream slots are all held (RESOURCE_EXHAUSTED before the first chunk) is busy, not failed: the
stream goes to another replica or waits a moment, BUSY_TRIES times, before the refusal reaches the caller.
Mixed into `RolloutRouter` (`fleet/router.py`), whose picking, releasing and `_behind` it uses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc

from meshrl.api.rollout.v1 import rollout_pb2 as pb
from meshrl.common.errors import Unavailable, from_rpc_error
from meshrl.scheduler.fleet.router_types import (
    RETRYABLE,
    StaleFleet,
    StreamResult,
    _Behind,
    checked_stream,
    sampling_params,
)

BUSY_TRIES = 8  # replicas that refused a stream for want of a slot, tried again after a growing pause
BUSY_PAUSE_MAX_S = 1.0


class StreamingMixin:
    """`RolloutRouter`'s single-response calls; they use its `_pick`, `_release`, `_behind` and `min_version`."""

    def stream(
        self,
        prompt_ids: Sequence[int] = (),
        *,
        sampling: pb.SamplingParams | Mapping[str, Any],
        prompt_text: str = "",
        session_id: str = "",
        request_id: str = "",
        timeout: float | None = None,
    ) -> Iterator[tuple[str, pb.GenerateChunk]]:
        """Yields (replica_id, chunk) of one response; retried on another replica until the first chunk arrived.
        A replica whose tokens come from weights older than `min_version` is reported (`on_behind`) and the
        response is made on another one, as in `generate_batch`."""
        params = sampling_params(sampling)
        deadline = time.monotonic() + (timeout or self.rpc_timeout_s)
        excluded: set[str] = set()
        attempts = 0
        req = pb.GenerateRequest(
            prompt_ids=list(prompt_ids),
            prompt_text=prompt_text,
            sampling=params,
            session_id=session_id,
            request_id=request_id,
        )
        busy, pause = 0, 0.0
        while True:
            time.sleep(pause)  # after a busy replica's refusal
            pause = 0.0
            replica = self._pick(1, session=session_id, exclude=excluded, deadline=deadline)
            attempts += 1
            started = False
            failed = False
            try:
                left = max(1.0, deadline - time.monotonic())
                stream = replica.stub.GenerateStream(req, timeout=left, wait_for_ready=False)
                for chunk in checked_stream(stream, self.min_version):
                    started = True
                    yield replica.replica_id, chunk
                return
            except _Behind as behind:
                failed = True  # released below; the fleet refits it before it serves again
                self._behind(replica, 0, behind.version, release=False)
                excluded.add(replica.replica_id)
                if attempts >= self.max_attempts or time.monotonic() >= deadline:
                    raise StaleFleet(
                        f"rollout replica {replica.replica_id} generated with weight version "
                        f"{behind.version} but the job is at version {self.min_version}, and so did "
                        f"every replica tried ({attempts} attempts); refit the replicas"
                    ) from None
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not started and busy < BUSY_TRIES:
                    # every stream slot of the replica is held (its limits.max_streams): another replica, or
                    # this one a moment later; not a failure of the replica, and not one of max_attempts
                    busy, attempts = busy + 1, attempts - 1
                    pause = min(BUSY_PAUSE_MAX_S, 0.05 * 2**busy)
                    excluded.add(replica.replica_id)
                    if time.monotonic() < deadline:
                        continue
                failed = exc.code() in RETRYABLE
                if not failed or started or attempts >= self.max_attempts or time.monotonic() >= deadline:
                    raise from_rpc_error(exc) from None
                excluded.add(replica.replica_id)
            finally:
                self._release(replica, 1, failed=failed)

    def generate(self, prompt_ids: Sequence[int] = (), **request: Any) -> StreamResult:
        """One whole response; a replica dying mid-response restarts it elsewhere (nothing duplicated).
        `request`: the keyword arguments of `stream` (sampling, prompt_text, session_id, request_id, timeout)."""
        attempts = 0
        while True:
            attempts += 1
            out = StreamResult([], [], [], 0, "", "")
            try:
                for replica_id, chunk in self.stream(prompt_ids, **request):
                    out.replica_id = replica_id
                    out.token_ids += chunk.token_ids
                    out.logprobs += chunk.logprobs
                    out.weight_versions += chunk.weight_versions
                    out.text += chunk.text
                    out.finish_reason = chunk.finish_reason or out.finish_reason
                return out
            except StaleFleet:
                raise  # no replica serves the job's weights: retrying cannot help before a refit
            except Unavailable:
                if attempts >= self.max_attempts:
                    raise
