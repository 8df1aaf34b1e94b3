"""How the step loop runs a step's DAG in each `training.mode`: `SyncSteps` runs it whole; `AsyncSteps` runs
only the consumer side, fed from the sample stream that a `Producer` thread fills ahead of it (the staleness
filter drops groups more than eta versions old; they are counted). Both report the overlap per step: trainer-
and rollout-busy shares of the time since the previous step ended (`busy/trainer`,
`busy/rollout`) and their idle fractions, the consumed groups' staleness histogram,
dropped groups, the stream's length, and the rollout-vs-trainer log-prob gap per version lag.
Built by `JobRunner.run_job` (meshrl.scheduler.step.job.runner) with `make_steps`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
from opentelemetry import context as otel_context
from opentelemetry import trace

from meshrl.common import batch_schema as S
from meshrl.common import telemetry
from meshrl.common.codec import concat_batches
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.common.errors import Cancelled, FailedPrecondition, InvalidArgument
from meshrl.common.telemetry import attributes as A
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.step.dag.executor import NodeResult, StepExecutor
from meshrl.scheduler.step.pacing.modes import AsyncPlan, node_kinds, plan_async
from meshrl.scheduler.step.pacing.producer import STREAM, Producer, prompt_of, rows_key
from meshrl.scheduler.step.pacing.staleness import AdmissionGate, staleness_histogram

LEARNER_GROUP = "learner"
READ_BLOCK_SECONDS = 1.0
LEFTOVER_READ = 1000  # groups per read when discarding what a previous attempt left in the stream
LEFTOVER_CLAIM_SECONDS = 0.001  # ... including those it had read and not acked (its consumer is gone)


class StepSpans:
    """The root span of each step, made when its first node starts (the producer's, in async modes) and
    ended by the step loop once the step has trained: the producer's spans are inside the consumer's step."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._spans: dict[int, trace.Span] = {}
        self._lock = threading.Lock()

    def _get(self, step: int) -> trace.Span:
        with self._lock:
            if step not in self._spans:
                self._spans[step] = telemetry.tracer().start_span(
                    A.step_span_name(step),
                    context=otel_context.Context(),
                    attributes={A.STEP: step, A.JOB_ID: self.job_id},
                )
            return self._spans[step]

    @contextlib.contextmanager
    def use(self, step: int, end: bool = False) -> Iterator[trace.Span]:
        span = self._get(step)
        try:
            with trace.use_span(span, end_on_exit=False):
                yield span
        finally:
            if end:
                with self._lock:
                    self._spans.pop(step, None)
                span.end()

    def end_all(self) -> None:
        with self._lock:
            spans, self._spans = list(self._spans.values()), {}
        for span in spans:
            span.end()


class IdleMeter:
    """Each side's busy and idle share of the wall time since the previous step ended (an evaluation between two
    steps counts in the next one's): `busy/trainer` is the trainer nodes' seconds over it, `busy/rollout`
    the rollout's (the producer's generation, in the asynchronous modes, wherever it fell in that time), each at
    most 1; the `async/*_idle_fraction`s are 1 minus them. Not under `time/`, whose keys are seconds."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.rollout_seen = 0.0

    def fractions(self, trainer_busy: float, rollout_total: float) -> dict[str, float]:
        now = time.perf_counter()
        wall, self.last = max(now - self.last, 1e-9), now
        rollout_busy, self.rollout_seen = rollout_total - self.rollout_seen, rollout_total
        trainer_share, rollout_share = min(1.0, trainer_busy / wall), min(1.0, max(0.0, rollout_busy) / wall)
        return {
            "busy/trainer": trainer_share,
            "busy/rollout": rollout_share,
            "async/trainer_idle_fraction": 1.0 - trainer_share,
            "async/rollout_idle_fraction": 1.0 - rollout_share,
        }


class SyncSteps:
    """`training.mode: sync`: each step runs the whole DAG (generate, score, log-probs, train) in order."""

    def __init__(self, executor: StepExecutor, buffer: DataBufferClient, job_id: str, nodes: list) -> None:
        self.executor = executor
        self.buffer = buffer
        self.job_id = job_id
        self.rollout_ids, self.trainer_ids = node_kinds(nodes)
        self.spans = StepSpans(job_id)
        self.idle = IdleMeter()
        self.rollout_total = 0.0

    def start(self, step: int, version: int) -> None:
        self.idle = IdleMeter()

    def step_span(self, step: int):
        return self.spans.use(step, end=True)

    def run_step(self, step: int, version: int) -> dict[str, float]:
        metrics, _ = self.executor.run_nodes(self.job_id, step, version=version)  # gap per lag: in old_logprob's
        self.rollout_total += sum(metrics.get(f"time/{i}", 0.0) for i in self.rollout_ids)
        return metrics

    def finish_step(self, metrics: dict[str, float]) -> None:
        """After the step's publication: its idle fractions."""
        busy = sum(metrics.get(f"time/{i}", 0.0) for i in self.trainer_ids)
        metrics.update(self.idle.fractions(busy, self._rollout_busy()))

    def _rollout_busy(self) -> float:
        return self.rollout_total

    def announce(self, version: int) -> None:
        """The fleet serves `version` and the step's evaluation is done."""

    def data_position(self) -> str:
        """What a checkpoint saves as the data position ("": the sampler's own)."""
        return ""

    def stop(self) -> None:
        self.spans.end_all()

    def join(self) -> None:
        pass


class AsyncSteps(SyncSteps):
    """`training.mode: one_step_off / async`: the consumer side of each step, fed from the sample stream."""

    def __init__(
        self,
        executor: StepExecutor,
        buffer: DataBufferClient,
        job_id: str,
        nodes: list,
        plan: AsyncPlan,
        cancelled: threading.Event,
        position_of: Callable[[], str] = lambda: "",
        last_step: int | None = None,
        requeue: Callable[[list[int]], None] | None = None,
    ) -> None:
        super().__init__(executor, buffer, job_id, nodes)
        self.plan = plan
        self.requeue = requeue  # stale_policy regenerate: record indexes back to the data loader
        if plan.stale_policy == "regenerate" and requeue is None:
            raise InvalidArgument(
                "training.stale_policy = 'regenerate' needs the job's data loader to put prompts "
                "back into; this runner has none: use stale_policy: drop"
            )
        self.trained: Counter[str] = Counter()  # group id -> times trained (the whole run's ledger)
        self.regenerated: list[int] = []  # record indexes put back as stale, in order
        self.discarded = 0  # groups a previous attempt left in the stream, discarded at start
        self.last_step = last_step
        self.position_of = position_of
        self.position = ""  # after the last consumed round: the sampler itself runs ahead
        self.split = plan.split
        self.eta = plan.eta
        self.stream_groups = plan.stream_groups
        self.round_groups = plan.round_groups
        self.cancelled = cancelled
        self.gate: AdmissionGate | None = None
        self.producer: Producer | None = None
        self.next_round = 1
        self.version = 0

    def start(self, step: int, version: int) -> None:
        """Starts producing from round step + 1 with the fleet at weight `version`."""
        super().start(step, version)
        self.next_round = step + 1
        self.version = version
        self.position = self.position_of()
        self.discarded = discard_leftovers(self.buffer, self.job_id)
        self.gate = AdmissionGate(step + 1, version, self.eta, self.stream_groups, self.round_groups, self.last_step)
        self.producer = Producer(
            self.executor,
            self.split,
            self.buffer,
            self.job_id,
            self.gate,
            self.spans.use,
            lambda: self.version,
            self.position_of,
            self.plan.data_node,
        )
        self.producer.start()

    def step_span(self, step: int):
        return self.spans.use(self.next_round, end=True)

    def _take_round(self, r: int, version: int) -> tuple[list, int, list[str]]:
        """Reads round r's groups from the stream: (fresh groups, stale ones, entry ids to ack). Under
        stale_policy drop the service's filter drops (acks and counts) stale groups; under regenerate they
        come back, their prompts are put back to the data loader, and they are acked here untrained."""
        size = self.gate.wait_round(r, self.cancelled)
        floor = max(0, version - self.eta)
        regenerate = self.plan.stale_policy == "regenerate"
        delivered, stale = [], 0
        while len(delivered) + stale < size:
            if self.cancelled.is_set():
                raise self._cancelled(r)
            got = self.buffer.read_groups(
                self.job_id,
                STREAM,
                LEARNER_GROUP,
                "runner",
                max_groups=size - len(delivered) - stale,
                block_seconds=READ_BLOCK_SECONDS,
                min_weight_version=0 if regenerate else floor,
            )
            old = [g for g in got.groups if g.weight_version < floor]
            if old:
                self._regenerate(old)
            delivered += [g for g in got.groups if g.weight_version >= floor]
            stale += got.dropped_stale + len(old)
        return delivered, stale, [g.entry_id for g in delivered]

    def _regenerate(self, groups: list) -> None:
        """Stale groups under stale_policy regenerate: their records go back to the data loader (generated again
        on the weights of the round that takes them), then the groups are acked untrained."""
        records = [prompt_of(g.group_id) for g in groups]
        unnamed = [g.group_id for g, i in zip(groups, records) if i is None]
        if unnamed:
            raise FailedPrecondition(
                f"stale groups {unnamed[:3]} do not name their prompt record, so they cannot "
                "be regenerated; the producer names them when the DATA_LOAD node writes "
                "prompt_index"
            )
        self.requeue(records)
        self.regenerated += records
        self.buffer.ack(self.job_id, STREAM, LEARNER_GROUP, [g.entry_id for g in groups])

    def _cancelled(self, r: int) -> Cancelled:
        return Cancelled(f"cancelled while reading the samples of round {r}")

    def run_step(self, step: int, version: int) -> dict[str, float]:
        groups, stale, entries, producer_metrics, rounds = [], 0, [], {}, 0
        wait_start = time.perf_counter()
        while not groups:  # a round whose groups were all too stale trains nothing: take the next one
            if rounds:
                self.gate.extend()
            delivered, lost, ids = self._take_round(self.next_round, version)
            producer_metrics, self.position = self.gate.consumed(self.next_round, len(delivered) + lost)
            groups, stale, entries = groups + delivered, stale + lost, entries + ids
            self.next_round += 1
            rounds += 1
        waited = time.perf_counter() - wait_start
        batch = concat_batches([g.batch for g in groups])
        batch.columns[S.GROUP_INDEX] = _renumbered(groups)
        key = rows_key(self.job_id, step)
        self.buffer.put(key, batch)
        given = {i: NodeResult([key], rewrites_rows=True) for i in self.split.producer}
        metrics, _ = self.executor.run_nodes(
            self.job_id, step, only=set(self.split.consumer), given=given, version=version
        )
        self.buffer.ack(self.job_id, STREAM, LEARNER_GROUP, entries)
        lags = [version - g.weight_version for g in groups]
        out = {**producer_metrics, **metrics, **staleness_histogram(lags), **self._ledger(groups, batch, stale)}
        out["async/stream_length"] = float(
            sum(s.length for s in self.buffer.stats(self.job_id).streams if s.stream == STREAM)
        )
        out.update(
            {
                "async/rounds": float(rounds),
                "async/wait_seconds": waited,
                "async/stream_groups": float(self.gate.unconsumed),
                "async/stream_groups_max": float(self.gate.max_unconsumed),
                "async/rollout_wait_seconds": self.gate.rollout_wait,
            }
        )
        return out

    def _ledger(self, groups: list, batch, stale: int) -> dict[str, float]:
        """Records the step's groups in the run's ledger; the step's group counts: trained, trained before
        (a duplicate), redelivered by the stream, stale ones dropped or regenerated, rows trained."""
        again = sum(self.trained[g.group_id] > 0 for g in groups)
        first = not self.trained
        self.trained.update(g.group_id for g in groups)
        regenerate = self.plan.stale_policy == "regenerate"
        return {
            "async/groups_trained": float(len(groups)),
            "async/groups_retrained": float(again),
            "async/groups_redelivered": float(sum(g.delivery_count > 1 for g in groups)),
            "async/rows_trained": float(batch.num_rows()),
            "async/dropped_groups": float(0 if regenerate else stale),
            "async/regenerated_groups": float(stale if regenerate else 0),
            "async/discarded_groups": float(self.discarded if first else 0),  # reported once
        }

    def _rollout_busy(self) -> float:
        return self.gate.rollout_busy

    def data_position(self) -> str:
        return self.position

    def announce(self, version: int) -> None:
        self.version = version
        self.gate.announce(version)

    def stop(self) -> None:
        if self.gate is not None:
            self.gate.stop()
        super().stop()

    def join(self) -> None:
        if self.producer is not None:
            self.producer.join(timeout=30.0)


def _renumbered(groups: list) -> np.ndarray:
    """Group indexes 0..G-1 over the consumed groups (rounds number their prompts from 0 each)."""
    return np.concatenate([np.full(g.batch.num_rows(), i, dtype=np.int64) for i, g in enumerate(groups)])


def discard_leftovers(buffer: DataBufferClient, job_id: str) -> int:
    """Acks, untrained, every group a previous attempt of the job left in its stream (generated after the
    checkpoint it resumes from: those rounds are generated again from the checkpoint's data position), so
    that none is trained twice; returns how many. A fresh job's stream is empty."""
    discarded = 0
    while True:
        got = buffer.read_groups(
            job_id, STREAM, LEARNER_GROUP, "runner", max_groups=LEFTOVER_READ, claim_idle_seconds=LEFTOVER_CLAIM_SECONDS
        )
        if not got.groups and not got.dropped_stale:
            return discarded
        if got.groups:
            buffer.ack(job_id, STREAM, LEARNER_GROUP, [g.entry_id for g in got.groups])
        discarded += len(got.groups) + got.dropped_stale


def make_steps(
    cfg: JobConfig,
    executor: StepExecutor,
    buffer: DataBufferClient,
    job_id: str,
    nodes: list,
    cancelled: threading.Event,
    position_of: Callable[[], str],
    requeue: Callable[[list[int]], None] | None = None,
) -> SyncSteps:
    """The step runner of `training.mode`; refuses (InvalidArgument) a DAG or bound the mode cannot run.
    `requeue` puts record indexes back to the data loader (training.stale_policy regenerate)."""
    t = cfg.training
    if t.mode == "sync":
        return SyncSteps(executor, buffer, job_id, nodes)
    plan = plan_async(t, cfg.data.prompts_per_step, nodes)
    return AsyncSteps(
        executor, buffer, job_id, nodes, plan, cancelled, position_of, last_step=cfg.job.steps, requeue=requeue
    )
