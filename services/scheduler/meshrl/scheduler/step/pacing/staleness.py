"""The staleness bound of asynchronous training: `AdmissionGate` lets the producer start round r only once
the trainer's weights are at most eta versions behind what round r will be trained with, and only while the
sample stream holds room for it (back-pressure); plus the per-step figures of staleness: the histogram of
consumed groups' version lag (the log-prob gap per token version lag comes from the trainer: step/dag/logprob_gap.py).
Used by `producer` (waits) and `pipeline` (announces, consumes), both in `meshrl.scheduler.step.pacing`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from meshrl.common.errors import Cancelled


class AdmissionGate:
    """Round r (1-based, the step that trains on it when nothing is dropped) is admitted when
    trainer_version >= first_version + (r - first_round) - eta and the stream's unconsumed groups, with those of
    the rounds admitted and not yet appended, leave room for `round_groups` more (at most `stream_groups`).
    With eta = 0 every round waits for the step before it: exactly the synchronous order."""

    def __init__(
        self,
        first_round: int,
        first_version: int,
        eta: int,
        stream_groups: int,
        round_groups: int,
        last_round: int | None = None,
    ):
        self.first_round = first_round
        self.last_round = last_round  # the job's last step: no round past it (None: unbounded)
        self.first_version = first_version
        self.eta = eta
        self.stream_groups = stream_groups
        self.round_groups = round_groups
        self.version = first_version
        self.unconsumed = 0  # groups appended and not yet consumed
        self.reserved: set[int] = set()  # rounds admitted and not yet appended (each holds round_groups of room)
        self.max_unconsumed = 0
        self.sizes: dict[int, int] = {}  # round -> groups appended
        self.metrics: dict[int, dict[str, float]] = {}  # round -> the producer side's node metrics
        self.positions: dict[int, str] = {}  # round -> the data position after it (what a checkpoint saves)
        self.rollout_busy = 0.0  # seconds the producer spent in ROLLOUT nodes (total)
        self.rollout_wait = 0.0  # seconds it waited for admission (total)
        self.error: BaseException | None = None
        self.stopped = False
        self._cond = threading.Condition()

    def _admits(self, r: int) -> bool:
        fresh = self.version >= self.first_version + (r - self.first_round) - self.eta
        held = self.unconsumed + len(self.reserved - {r}) * self.round_groups
        return fresh and held + self.round_groups <= self.stream_groups

    def admit(self, r: int) -> bool:
        """Blocks the producer until round r may start, and holds its room in the stream; False once the job
        stops or failed (or r is past its end)."""
        start = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: self._ended(r) or self._admits(r))
            self.rollout_wait += time.perf_counter() - start
            if self._ended(r):
                return False
            self.reserved.add(r)
            return True

    def _ended(self, r: int) -> bool:
        return self.stopped or self.error is not None or self._past_end(r)

    def _past_end(self, r: int) -> bool:
        return self.last_round is not None and r > self.last_round

    def extend(self) -> None:
        """A round was wholly dropped as stale: one more round is needed before the job ends."""
        with self._cond:
            if self.last_round is not None:
                self.last_round += 1
            self._cond.notify_all()

    def produced(
        self, r: int, groups: int, metrics: dict[str, float], rollout_seconds: float, position: str = ""
    ) -> None:
        with self._cond:
            self.reserved.discard(r)
            self.positions[r] = position
            self.sizes[r] = groups
            self.metrics[r] = metrics
            self.unconsumed += groups
            self.max_unconsumed = max(self.max_unconsumed, self.unconsumed)
            self.rollout_busy += rollout_seconds
            self._cond.notify_all()

    def wait_round(self, r: int, cancelled: threading.Event, poll: float = 0.5) -> int:
        """Blocks the consumer until round r is in the stream; returns its size. Raises the producer's error,
        or Cancelled when the job is cancelled or stopped meanwhile."""
        with self._cond:
            while r not in self.sizes:
                if self.error is not None:
                    raise self.error
                if cancelled.is_set() or self.stopped:
                    raise Cancelled(f"cancelled while waiting for the samples of round {r}")
                self._cond.wait(poll)
            return self.sizes[r]

    def consumed(self, r: int, groups: int) -> tuple[dict[str, float], str]:
        """The consumer took round r's `groups` (delivered or dropped); returns the round's producer metrics
        and the data position after it."""
        with self._cond:
            self.unconsumed -= groups
            self.sizes.pop(r, None)
            self._cond.notify_all()
            return self.metrics.pop(r, {}), self.positions.pop(r, "")

    def announce(self, version: int) -> None:
        """The trainer's weights are now `version` (published to the fleet, the step's evaluation done)."""
        with self._cond:
            self.version = version
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self.error = exc
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()


def staleness_histogram(lags: Iterable[int]) -> dict[str, float]:
    """Consumed groups by version lag (trainer version - the oldest version among the group's tokens)."""
    out: dict[str, float] = {}
    lags = list(lags)
    for lag in lags:
        out[f"async/staleness_{lag}"] = out.get(f"async/staleness_{lag}", 0.0) + 1.0
    out["async/staleness_max"] = float(max(lags, default=0))
    return out
