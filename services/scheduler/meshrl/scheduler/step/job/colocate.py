"""Colocated mode's turns (`services.placement: colocated`): the trainer and the rollout replicas share one
Ray bundle and its devices, so they take turns in this order every step (slime's offload / onload):

    replicas awake, trainer offloaded  ─►  ROLLOUT nodes generate
    replicas release weights + KV      ─►  trainer onloads  ─►  MODEL_INFERENCE / MODEL_TRAIN nodes
    replicas resume weights            ─►  trainer publishes into them (refills the released weights)
    trainer offloads                   ─►  replicas resume KV  ─►  (evaluation, the next step's rollout)

`Turns.wrap` wraps the step executor's handlers so each node runs in its phase (nodes of one phase run
concurrently; a node of the other phase waits for them); `Turns.publish` is the publication turn and
`Turns.trainer_only` lends the trainer the device between steps (a checkpoint). Called by
`meshrl.scheduler.step.job.runner`; the replicas' calls are Rollout.ReleaseMemory / ResumeMemory, the trainer's
Trainer.Offload / Onload (on CUDA they move memory; on CPU see `meshrl.trainer.offload`).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from meshrl.common.errors import ConfigError
from meshrl.scheduler.step.dag.executor import NodeResult, StepContext
from meshrl.scheduler.workflow.model import Node, NodeRole, NodeType

log = logging.getLogger(__name__)

MIB = float(1 << 20)
TRAINER_TYPES = (NodeType.MODEL_INFERENCE, NodeType.MODEL_TRAIN)
TRAINER_ROLES = (NodeRole.ACTOR, NodeRole.REFERENCE, NodeRole.CRITIC)


class Phase(str, enum.Enum):
    GENERATE = "generate"  # replicas awake, trainer offloaded
    TRAIN = "train"  # replicas asleep, trainer onloaded


class ReplicaLike(Protocol):
    address: str

    def release_memory(self, tags: Sequence[str] = ()) -> Any: ...

    def resume_memory(self, tags: Sequence[str] = ()) -> Any: ...


class TrainerLike(Protocol):
    def offload(self) -> Any: ...

    def onload(self) -> Any: ...


def node_phase(node: Node) -> Phase | None:
    """The phase a node runs in: ROLLOUT generates, a trainer role's forward or train step trains, the
    scheduler's own nodes (data load, rewards, advantages, barriers) run in either."""
    kind, role = NodeType(str(node.node_type)), NodeRole(str(node.node_role))
    if kind == NodeType.ROLLOUT:
        return Phase.GENERATE
    if kind in TRAINER_TYPES and role in TRAINER_ROLES:
        return Phase.TRAIN
    return None


def check_colocated_workflow(nodes: Sequence[Any]) -> None:
    """Raises ConfigError unless every trainer node depends (transitively) on every ROLLOUT node: a released
    replica is only woken by the publication at the end of the step, so no generation may follow training."""
    by_id = {n.node_id: n for n in nodes}

    def upstream(node_id: str, seen: set[str]) -> set[str]:
        for dep in by_id[node_id].dependencies:
            if dep not in seen:
                seen.add(dep)
                upstream(dep, seen)
        return seen

    rollouts = [n.node_id for n in nodes if node_phase(n) == Phase.GENERATE]
    for node in nodes:
        if node_phase(node) == Phase.TRAIN:
            missing = [r for r in rollouts if r not in upstream(node.node_id, set())]
            if missing:
                raise ConfigError(
                    "services.placement",
                    "colocated",
                    f"workflow node '{node.node_id}' (a trainer node) does not wait for ROLLOUT node(s) {missing}; "
                    "colocated replicas sleep while the trainer works and wake only after the publication",
                    f"make '{node.node_id}' depend on {missing}, or set services.placement: disaggregated",
                )


class Turns:
    """The order above, for one job's replicas and trainer. Thread-safe (the executor runs nodes on threads).

    `replicas()` gives the replicas to put to sleep (the fleet's serving ones); the ones released are the ones
    resumed. `metrics()` returns (and clears) what the last step measured: the replicas' resident memory
    awake and asleep, and the seconds spent releasing, resuming, offloading and onloading."""

    def __init__(self, replicas: Callable[[], Sequence[ReplicaLike]], trainer: TrainerLike) -> None:
        self._replicas = replicas
        self._trainer = trainer
        self._cond = threading.Condition()
        self._phase: Phase | None = None  # None: at start, everyone resident
        self._active = 0
        self._asleep: list[ReplicaLike] = []  # released weights + KV, not resumed yet
        self._kv_only: list[ReplicaLike] = []  # released KV only (lent to the trainer between steps)
        self._trainer_resident = True
        self._metrics: dict[str, float] = {}

    @property
    def phase(self) -> Phase | None:
        return self._phase

    # -- phases ------------------------------------------------------------------------------
    @contextmanager
    def turn(self, phase: Phase) -> Iterator[None]:
        """Runs the block in `phase`, switching to it once the other phase's blocks have ended."""
        with self._cond:
            self._cond.wait_for(lambda: self._active == 0 or self._phase == phase)
            if self._phase != phase:
                self._switch(phase)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def _switch(self, phase: Phase) -> None:
        if phase == Phase.TRAIN:
            self._sleep_replicas()
            self._onload_trainer()
        elif self._asleep:  # generation after training in one step: check_colocated_workflow refuses it
            raise ConfigError(
                "services.placement",
                "colocated",
                "a ROLLOUT node asked to run while the replicas sleep "
                "(their weights come back with the next publication)",
                "order the workflow's ROLLOUT nodes before its trainer nodes",
            )
        self._phase = phase

    def sleep_replicas(self) -> None:
        """Puts the replicas to sleep now (before the trainer loads its models at the start of a job); the
        first publication wakes them."""
        with self._cond:
            self._cond.wait_for(lambda: self._active == 0)
            self._sleep_replicas()
            self._phase = Phase.TRAIN

    def _sleep_replicas(self) -> None:
        awake = [r for r in self._replicas() if r not in self._asleep]
        before = after = seconds = 0.0
        for replica in awake:
            reply = replica.release_memory(())
            self._asleep.append(replica)
            before += reply.resident_bytes_before
            after += reply.resident_bytes_after
            seconds += reply.seconds
        if awake:
            self._metrics.update(
                {
                    "colocate/replica_rss_awake_mib": before / MIB,
                    "colocate/replica_rss_asleep_mib": after / MIB,
                    "colocate/release_seconds": seconds,
                }
            )

    def _onload_trainer(self) -> None:
        if not self._trainer_resident:
            reply = self._trainer.onload()
            self._metrics["colocate/onload_seconds"] = getattr(reply, "seconds", 0.0)
            self._trainer_resident = True

    def _offload_trainer(self) -> None:
        if self._trainer_resident:
            reply = self._trainer.offload()
            self._metrics["colocate/offload_seconds"] = getattr(reply, "seconds", 0.0)
            self._metrics["colocate/trainer_offloaded_mib"] = getattr(reply, "bytes", 0) / MIB
            self._trainer_resident = False

    # -- the publication turn -------------------------------------------------------------------
    def publish(self, publish: Callable[[], Any]) -> Any:
        """Resumes the sleeping replicas' weights, runs `publish()` (which refills them), offloads the trainer
        and gives the replicas their KV cache back; returns what `publish` returned."""
        with self._cond:
            self._cond.wait_for(lambda: self._active == 0)
            asleep, self._asleep = self._asleep, []
            seconds = 0.0
            try:
                for replica in asleep:
                    seconds += replica.resume_memory(["weights"]).seconds
                result = publish()
                self._offload_trainer()
            finally:
                for replica in asleep:
                    seconds += replica.resume_memory(["kv_cache"]).seconds
                self._metrics["colocate/resume_seconds"] = seconds
                self._phase = Phase.GENERATE
            return result

    @contextmanager
    def trainer_only(self) -> Iterator[None]:
        """Lends the trainer the device between steps (a checkpoint): the replicas give up their KV cache (their
        weights stay), the trainer onloads; afterwards it offloads and the replicas take their KV back."""
        with self._cond:
            self._cond.wait_for(lambda: self._active == 0)
            if self._phase != Phase.GENERATE:  # the trainer is resident already
                yield
                return
            lent = list(self._replicas())
            try:
                for replica in lent:
                    replica.release_memory(["kv_cache"])
                    self._kv_only.append(replica)
                self._onload_trainer()
                yield
                self._offload_trainer()
            finally:
                for replica in self._kv_only:
                    replica.resume_memory(["kv_cache"])
                self._kv_only = []

    # -- the executor's handlers ------------------------------------------------------------------
    def wrap(self, handler_for: Callable[[Any], Callable[[Any, StepContext], NodeResult]]):
        """The executor's `handler_for`, with every node run in its phase (`node_phase`)."""

        def wrapped_for(node: Node) -> Callable[[Any, StepContext], NodeResult]:
            handler, phase = handler_for(node), node_phase(node)
            if phase is None:
                return handler

            def in_turn(n: Any, ctx: StepContext) -> NodeResult:
                with self.turn(phase):
                    return handler(n, ctx)

            return in_turn

        return wrapped_for

    def metrics(self) -> dict[str, float]:
        with self._cond:
            out, self._metrics = self._metrics, {}
            return out
