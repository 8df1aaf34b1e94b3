"""The producer side of an asynchronous job: a thread that runs the DAG's producer nodes (data load, rollout,
reward, ...) round after round, as far ahead as `AdmissionGate` allows (a round's reward and hand-off run in a
finisher thread while the next round generates), and appends each round's samples to the job's sample stream
in the data buffer, one group per prompt, each stamped with the oldest weight version among its tokens and
named by its round, group and dataset record (`r<round>-g<group>-p<record>`). Its spans live in the trace of
the step that will consume the round (`StepSpans`).
Started and stopped by `meshrl.scheduler.step.pacing.pipeline.AsyncSteps`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Batch
from meshrl.common.databuffer_client import DataBufferClient, Group
from meshrl.scheduler.step.dag.executor import StepContext, StepExecutor
from meshrl.scheduler.step.pacing.modes import Split
from meshrl.scheduler.step.pacing.staleness import AdmissionGate

log = logging.getLogger(__name__)

STREAM = "samples"  # the job's sample stream
ROWS_NODE = "_stream"  # pseudo node: the consumer side's rows, read from the stream, under (job, step, _stream)
GROUP_ID_RE = re.compile(r"^r(\d+)-g(\d+)(?:-p(\d+))?$")


def split_groups(batch: Batch, round_: int, fallback_version: int, prompts: np.ndarray | None = None) -> list[Group]:
    """One group per prompt (rows sharing a group_index, in order of first appearance); a group's
    weight version is the oldest version among its tokens. With `prompts` (the round's prompt_index, one per
    group index) the group's id names its dataset record too: r<round>-g<group>-p<record>."""
    groups = np.asarray(batch[S.GROUP_INDEX], dtype=np.int64)
    versions = batch.columns.get(S.RESPONSE_VERSIONS)
    out: list[Group] = []
    for g in dict.fromkeys(groups.tolist()):
        rows = np.flatnonzero(groups == g).tolist()
        part = batch.take(rows)
        version = fallback_version
        if versions is not None and part[S.RESPONSE_VERSIONS].values.size:
            version = int(part[S.RESPONSE_VERSIONS].values.min())
        name = f"r{round_}-g{g}" if prompts is None or g >= len(prompts) else f"r{round_}-g{g}-p{int(prompts[g])}"
        out.append(Group(name, version, part))
    return out


def prompt_of(group_id: str) -> int | None:
    """The dataset record a group was generated from (None: its id does not say)."""
    match = GROUP_ID_RE.match(group_id)
    return int(match.group(3)) if match and match.group(3) is not None else None


def boundary_keys(ctx: StepContext, split: Split) -> list:
    """The keys a consumer node would read from the boundary nodes, as one list."""
    nodes = {**ctx.nodes, ROWS_NODE: types.SimpleNamespace(dependencies=list(split.boundary))}
    return StepContext(ctx.job_id, ctx.step, ctx.results, nodes).input_keys(ROWS_NODE)


class Producer:
    def __init__(
        self,
        executor: StepExecutor,
        split: Split,
        buffer: DataBufferClient,
        job_id: str,
        gate: AdmissionGate,
        span_for: Callable[[int], object],
        version_of: Callable[[], int],
        position_of: Callable[[], str] = lambda: "",
        data_node: str = "",
    ) -> None:
        self.executor = executor
        self.split = split
        self.buffer = buffer
        self.job_id = job_id
        self.gate = gate
        self.span_for = span_for  # round -> context manager making the step's span current
        self.version_of = version_of  # the fleet's current weight version (a group without token versions)
        self.position_of = position_of  # the data sampler's position (after a round: where the next starts)
        self.data_node = data_node  # the DATA_LOAD node whose prompt_index names each group's record
        self.produced: list[str] = []  # ids of every group appended, in order
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        """Generates round after round as admitted; each round's finish (the producer nodes after generation,
        then the hand-off to the stream) runs in one finisher thread, in round order, while the next round
        generates, so the replicas do not wait for the reward and the stream writes."""
        r = self.gate.first_round
        finisher = ThreadPoolExecutor(1, thread_name_prefix="producer-finish")
        try:
            while self.gate.admit(r):
                finisher.submit(self._finish, r, *self._generate(r))
                r += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it in the step loop
            self._failed(r, exc)
        finally:
            finisher.shutdown(wait=True)

    def _failed(self, r: int, exc: BaseException) -> None:
        if not self.gate.stopped:
            log.warning("producer failed at round %d: %s", r, exc)
        self.gate.fail(exc)

    def _generate(self, r: int) -> tuple[int, float, dict[str, float], StepContext, str]:
        """Round r's generation nodes (data load, rollout); returns what `_finish` needs, with the data
        position taken now, before the next round's data load moves it."""
        version = self.version_of()
        start = time.perf_counter()
        with self.span_for(r):
            metrics, ctx = self.executor.run_nodes(self.job_id, r, only=set(self.split.generation))
        return version, start, metrics, ctx, self.position_of()

    def _finish(
        self, r: int, version: int, start: float, metrics: dict[str, float], ctx: StepContext, position: str
    ) -> None:
        """The rest of round r's producer nodes, then its groups into the stream and the gate told."""
        if self.gate.error is not None:
            return  # an earlier round failed: the job stops
        try:
            with self.span_for(r):
                more, ctx = self.executor.run_nodes(self.job_id, r, only=set(self.split.finish), given=ctx.results)
                metrics.update(more)
                handoff = time.perf_counter()
                batch = self.buffer.get_many(boundary_keys(ctx, self.split))
                groups = split_groups(batch, r, version, self._prompts(ctx))
                self.buffer.append_groups(self.job_id, STREAM, groups)
                self.produced += [g.group_id for g in groups]
            for key in self.buffer.list(self.job_id, r):  # the round's own keys: its rows are in the stream now
                self.buffer.delete(key)
            metrics["async/handoff_seconds"] = time.perf_counter() - handoff
            metrics["async/produce_seconds"] = time.perf_counter() - start
            rollout = sum(metrics.get(f"time/{i}", 0.0) for i in self.split.rollout)
            metrics["async/groups_produced"] = float(len(groups))
            self.gate.produced(r, len(groups), metrics, rollout, position)
        except BaseException as exc:  # noqa: BLE001 - the consumer raises it (the generating side stops too)
            self._failed(r, exc)

    def _prompts(self, ctx: StepContext) -> np.ndarray | None:
        """The round's prompt_index (one per prompt, in group-index order), if its data node wrote one."""
        result = ctx.results.get(self.data_node) if self.data_node else None
        if result is None or not result.outputs:
            return None
        batch = self.buffer.get(result.outputs[0], columns=[S.PROMPT_INDEX], missing_ok=True)
        return np.asarray(batch[S.PROMPT_INDEX]) if S.PROMPT_INDEX in batch.columns else None


def rows_key(job_id: str, step: int):
    return batch_key(job_id, step, ROWS_NODE)
