"""The step executor: walks a workflow's DAG once per training step, in dependency order,
running independent branches concurrently, and records each node's status and metrics.

Each node gets the data-buffer keys written by its upstream nodes (transitively, stopping
at a node that rewrites whole rows, such as a dynamic-sampling filter) and returns the
keys it wrote; only keys pass through here, never bulk data.

Concurrent nodes run on a pool of worker threads kept for the executor's life, one pool per calling thread
(the asynchronous modes' producer and consumer each walk their side of the DAG at the same time): a pool made
per step started its threads again every step, on the step's critical path. `close` stops them.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opentelemetry.trace import Status, StatusCode

from meshrl.api.common.v1 import keys_pb2
from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.common import telemetry
from meshrl.common.telemetry import attributes as A
from meshrl.scheduler.events import EventLog
from meshrl.scheduler.inline import run_inline
from meshrl.scheduler.workflow.model import Node

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class NodeResult:
    outputs: list[keys_pb2.BatchKey] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    rewrites_rows: bool = False  # downstream nodes read only from here on (e.g. a filter)
    rows: int | None = None  # rows of the batch it wrote, when it knows (nobody reads the batch to count them)


@dataclass
class StepContext:
    job_id: str
    step: int
    results: dict[str, NodeResult] = field(default_factory=dict)
    nodes: dict[str, Any] = field(default_factory=dict)
    version: int | None = None  # the weight version the step trains from (None: not told)
    held: dict[str, dict[str, Any]] = field(default_factory=dict)  # columns the built-in COMPUTE nodes hold (held.py)
    scheduled: frozenset[str] = frozenset()  # the nodes this walk runs (the rest are given, or run elsewhere)
    _once: dict[str, Future] = field(default_factory=dict, repr=False)
    _once_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def once(self, key: str, fn: Callable[[], T]) -> T:
        """`fn()` run once per `key` in this step: the first node to ask runs it, nodes asking later (in other
        threads) wait for its result, or get its error."""
        with self._once_lock:
            future, first = self._once.get(key), key not in self._once
            if first:
                future = self._once[key] = Future()
        if first:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)
        return future.result()

    def input_keys(self, node_id: str) -> list[keys_pb2.BatchKey]:
        """Keys of every upstream node's output, nearest first, not past a row-rewriting node."""
        keys: list[keys_pb2.BatchKey] = []
        seen: set[str] = set()
        frontier = list(self.nodes[node_id].dependencies)
        while frontier:
            dep = frontier.pop(0)
            if dep in seen:
                continue
            seen.add(dep)
            result = self.results[dep]
            keys += [k for k in result.outputs if k not in keys]  # given results may share one key
            if not result.rewrites_rows:
                frontier += list(self.nodes[dep].dependencies)
        return keys


class NodeFailed(Exception):
    def __init__(self, node_id: str, step: int, detail: str, cause: BaseException | None = None) -> None:
        super().__init__(f"node '{node_id}' failed at step {step}:\n{detail}")
        self.node_id = node_id
        self.detail = detail
        self.__cause__ = cause  # the node's own error: recovery tells a dead service from bad input by it


Handler = Callable[[Any, StepContext], NodeResult]


class StepExecutor:
    def __init__(self, nodes: list[Any], handler_for: Callable[[Any], Handler], events: EventLog, workers: int = 4):
        self.nodes = {n.node_id: n for n in nodes}
        self.handler_for = handler_for
        self.events = events
        self.workers = workers
        self._pools: dict[int, ThreadPoolExecutor] = {}
        self._pools_lock = threading.Lock()

    def _pool(self) -> ThreadPoolExecutor:
        """The calling thread's node pool (made on its first concurrent step, then reused)."""
        with self._pools_lock:
            pool = self._pools.get(threading.get_ident())
            if pool is None:
                pool = self._pools[threading.get_ident()] = ThreadPoolExecutor(self.workers, thread_name_prefix="node")
            return pool

    def close(self) -> None:
        """Stops the node pools' threads (after the nodes they run end); a later step makes new ones."""
        with self._pools_lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=True)

    def _run_node(self, node: Node, ctx: StepContext) -> NodeResult:
        attrs = {A.NODE_ID: node.node_id, A.NODE_TYPE: str(node.node_type), A.NODE_ROLE: str(node.node_role)}
        with telemetry.tracer().start_as_current_span(
            A.node_span_name(node.node_id), attributes=attrs, record_exception=False, set_status_on_exception=False
        ) as span:  # the failure is recorded once, below
            start = time.perf_counter()
            self.events.node(ctx.step, node.node_id, spb.NODE_STATE_RUNNING)
            try:
                result = self.handler_for(node)(node, ctx)
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                raise
            seconds = time.perf_counter() - start
            result.metrics[f"time/{node.node_id}"] = seconds
            telemetry.metrics().record_node(node.node_id, seconds, node_type=str(node.node_type))
            self.events.node(ctx.step, node.node_id, spb.NODE_STATE_COMPLETED, seconds=seconds)
            return result

    def run_step(self, job_id: str, step: int) -> dict[str, float]:
        """Runs every node of the DAG once; raises NodeFailed (after the running nodes end) on failure."""
        return self.run_nodes(job_id, step)[0]

    def run_nodes(
        self,
        job_id: str,
        step: int,
        only: set[str] | None = None,
        given: dict[str, NodeResult] | None = None,
        version: int | None = None,
    ) -> tuple[dict[str, float], StepContext]:
        """Runs the nodes in `only` (default: all), with `given` standing in for the results of nodes
        that ran elsewhere (the producer side of an asynchronous step); `version`: the weight version the
        step trains from (the actor's log-prob pass reports the rollout gap per version lag against it).
        Returns (metrics, context)."""
        pending = {i: n for i, n in self.nodes.items() if (only is None or i in only) and i not in (given or {})}
        ctx = StepContext(
            job_id, step, results=dict(given or {}), nodes=self.nodes, version=version, scheduled=frozenset(pending)
        )
        for node_id in pending:
            self.events.node(step, node_id, spb.NODE_STATE_PENDING)
        running: dict[Future, str] = {}
        failure: NodeFailed | None = None
        metrics: dict[str, float] = {}
        while pending or running:
            if failure is None:
                ready = [i for i, n in pending.items() if all(d in ctx.results for d in n.dependencies)]
                for node_id in ready:
                    node = pending.pop(node_id)
                    if len(ready) == 1 and not running:  # alone: in this thread, no hand-off to a pool thread
                        running[run_inline(self._run_node, node, ctx)] = node_id
                    else:
                        future = self._pool().submit(contextvars.copy_context().run, self._run_node, node, ctx)
                        running[future] = node_id
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                node_id = running.pop(future)
                try:
                    ctx.results[node_id] = result = future.result()
                    metrics.update(result.metrics)
                except Exception as exc:  # noqa: BLE001 - reported as the node's failure
                    detail = "".join(traceback.format_exception(exc))
                    self.events.node(step, node_id, spb.NODE_STATE_FAILED, error=detail)
                    failure = failure or NodeFailed(node_id, step, detail, exc)
        if failure is not None:
            raise failure
        if pending:  # an upstream node was neither run nor given: a wrong split, never a silent skip
            raise NodeFailed(next(iter(pending)), step, f"upstream results missing for {sorted(pending)}")
        return metrics, ctx
