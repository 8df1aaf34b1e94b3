"""A trainer whose ranks are Ray actors, one per placement-group bundle (slime's RayTrainGroup).

Rank r runs on bundle r (pinned to the node of the plan's worker for rank r, see `trainer_plan.py`) as the
trainer's own launcher-started rank (`data_parallel.launcher=environment`): its actor starts
`python -m meshrl.trainer` with RANK, WORLD_SIZE, LOCAL_RANK (its place among the group's ranks on its node),
MASTER_ADDR / MASTER_PORT (rank 0's node and a free port there, asked of rank 0's actor), CUDA_VISIBLE_DEVICES
(its bundle's GPUs) and gloo on CPUs or NCCL on GPUs. Rank 0 serves the gRPC API the step loop calls; the
other ranks run its commands. The group owns its lifecycle: `create` (bundles, actors, processes, until rank 0
serves), `teardown`, `recreate`. A rank whose process exits, or whose actor is lost with its node, is reported
at once (`on_exit`), so the job fails the step instead of waiting in a collective, and its recovery
(`recovery.run_with_restarts`) recreates the group. Used by `launch.services.JobServices` (`trainer.launch:
group`) and by tests that drive a group directly.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from meshrl.common.errors import DeadlineExceeded, InvalidArgument, Unavailable
from meshrl.scheduler.launch.exit_watch import describe_exit
from meshrl.scheduler.launch.launcher import child_env, on_node
from meshrl.scheduler.launch.placement import WorkerBundles, create_pinned_bundles, launch_pinned
from meshrl.scheduler.launch.process import ServiceProcess

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankPlacement:
    """Where trainer rank `rank` runs: the plan's worker ("n1:0", or "" without a plan), the node's address and
    id, the bundle's index in the group's placement group and the GPU ids Ray gave it (none on CPUs)."""

    rank: int
    worker: str
    node_ip: str
    node_id: str
    bundle_index: int
    devices: tuple[int, ...]

    def as_dict(self) -> dict:
        return {
            "rank": self.rank,
            "worker": self.worker,
            "node": self.node_ip,
            "bundle": self.bundle_index,
            "devices": list(self.devices),
        }


def local_ranks(nodes: Sequence[str]) -> list[int]:
    """Each rank's LOCAL_RANK: how many lower ranks run on its node."""
    seen: dict[str, int] = {}
    out = []
    for node in nodes:
        out.append(seen.get(node, 0))
        seen[node] = out[-1] + 1
    return out


RENDEZVOUS_TRIES = 3  # starts of a group whose rendezvous port was taken before rank 0 bound it


class RendezvousPortTaken(Unavailable):
    """Rank 0 could not listen on the rendezvous port its actor had found free (another process took it)."""


def start_failure(what: str, log_tail: str) -> Unavailable:
    """The error of a rank that ended while its group started, with the tail of its log; RendezvousPortTaken
    when rank 0's rendezvous port was taken meanwhile (torch's TCPStore: EADDRINUSE), which a new port cures."""
    error = RendezvousPortTaken if "EADDRINUSE" in log_tail else Unavailable
    return error(f"{what}:\n{log_tail}")


def rank_env(rank: int, world: int, local_rank: int, master: tuple[str, int]) -> dict[str, str]:
    """The variables a launcher sets for a trainer rank (read by `meshrl.trainer.launched`)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
        "MASTER_ADDR": master[0],
        "MASTER_PORT": str(master[1]),
    }


def group_args(args: Sequence[str], gpus_per_rank: float) -> list[str]:
    """The trainer's args as every rank of a group gets them: environment launcher, gloo or NCCL by device."""
    backend = "nccl" if gpus_per_rank else "gloo"
    return [*args, "--set", "data_parallel.launcher=environment", "--set", f"data_parallel.backend={backend}"]


class _TrainerRankImpl:
    """Body of the Ray actor that owns one trainer rank's process on its bundle (threaded: `wait_exit` blocks
    while the other calls are served)."""

    def __init__(self, args: list[str], log_path: str, env: dict[str, str], gpu_ids: list) -> None:
        import ray

        self.node_ip = ray.util.get_node_ip_address()
        self.args, self.env = on_node(args, env, self.node_ip, gpu_ids)
        self.log_path = log_path
        self.proc: ServiceProcess | None = None
        self.started = threading.Event()

    def master(self) -> tuple[str, int]:
        """Rank 0's rendezvous: this node's address and a port free on it now."""
        from meshrl.common.net import free_port

        return self.node_ip, free_port(self.node_ip)

    def spawn(self, env: dict[str, str]) -> int:
        self.proc = ServiceProcess("trainer", self.args, self.log_path, {**self.env, **env})
        self.proc.spawn()
        self.started.set()
        return self.proc.pid

    def serve(self, timeout: float) -> str:
        """Rank 0: the address it advertises once every rank joined and it serves."""
        return self.proc.wait_serving(timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def wait_exit(self) -> int:
        self.started.wait()
        return self.proc.proc.wait()

    def stop(self, grace: float) -> int | None:
        return self.proc.stop(grace) if self.proc is not None else None


class TrainerGroup:
    """`world` trainer ranks as Ray actors on their own bundles. `pins[r]` is added to rank r's bundle (a
    node's own resource pins it there: `placement.ClusterNode.pin`; `{}` leaves it to `strategy`), `workers[r]`
    names the plan's worker. `on_exit(rank, what)` is told, from the group's watch thread, when the first rank
    of a running group ends on its own. Ray must be initialised."""

    def __init__(
        self,
        args: Sequence[str],
        world: int,
        logs: Path,
        bundle: Mapping[str, float],
        pins: Sequence[Mapping[str, float]] | None = None,
        workers: Sequence[str] | None = None,
        *,
        strategy: str = "PACK",
        timeout: float = 180.0,
        name: str = "trainer",
        on_exit: Callable[[int, str], None] | None = None,
    ) -> None:
        pins = list(pins) if pins is not None else [{} for _ in range(world)]
        workers = list(workers) if workers is not None else ["" for _ in range(world)]
        if world < 1 or len(pins) != world or len(workers) != world:
            raise InvalidArgument(
                f"a trainer group of {world} ranks needs one pin and one worker per rank, got {len(pins)} and "
                f"{len(workers)}. Fix: pass world >= 1 and the plan's workers of ranks 0..world-1"
            )
        import ray

        self.ray = ray
        self.args = group_args(args, bundle.get("GPU", 0.0))
        self.world, self.logs, self.bundle, self.pins, self.workers = world, logs, dict(bundle), pins, workers
        self.strategy, self.timeout, self.name, self.on_exit = strategy, timeout, name, on_exit
        self.actor_cls = ray.remote(max_concurrency=4)(_TrainerRankImpl)
        self.bundles: WorkerBundles | None = None
        self.actors: list = []
        self.placements: tuple[RankPlacement, ...] = ()
        self.address: str | None = None
        self.pids: tuple[int, ...] = ()  # of the rank processes, on their nodes
        self._exits: dict = {}  # wait_exit ref -> rank
        self._closing = threading.Event()
        self._watch: threading.Thread | None = None

    def log_path(self, rank: int) -> Path:
        return self.logs / (f"{self.name}.log" if rank == 0 else f"{self.name}-rank{rank}.log")

    def create(self) -> str:
        """Places the bundles, starts one actor and one rank process per bundle and returns rank 0's address
        once it serves (every rank has joined). On any failure what was started is torn down and the error
        (ResourceExhausted when the bundles cannot be placed, naming them) is raised. A rendezvous port taken
        by another process between rank 0's actor choosing it and rank 0 binding it is chosen anew, up to
        RENDEZVOUS_TRIES starts."""
        for _ in range(RENDEZVOUS_TRIES - 1):
            try:
                return self._create_once()
            except RendezvousPortTaken as exc:
                log.warning(
                    "trainer group '%s': %s; starting it again on another port", self.name, str(exc).splitlines()[0]
                )
        return self._create_once()

    def _create_once(self) -> str:
        if self.actors:
            raise InvalidArgument(f"trainer group '{self.name}' is running. Fix: teardown() or recreate() it")
        ray = self.ray
        self._closing = threading.Event()
        self.bundles = create_pinned_bundles(
            self.pins, self.bundle, self.strategy, name=f"meshrl-{self.name}", timeout_s=self.timeout
        )
        try:
            for rank, loc in enumerate(self.bundles.locations):
                self.actors.append(
                    launch_pinned(
                        self.actor_cls,
                        self.bundles,
                        rank,
                        self.args,
                        str(self.log_path(rank)),
                        child_env({}),
                        list(loc.gpu_ids),
                        name=f"meshrl-{self.name}-rank{rank}-{os.getpid()}",
                    )
                )
            master = ray.get(self.actors[0].master.remote(), timeout=self.timeout)
            nodes = [loc.node_ip for loc in self.bundles.locations]
            envs = [rank_env(r, self.world, local, master) for r, local in enumerate(local_ranks(nodes))]
            spawned = [a.spawn.remote(env) for a, env in zip(self.actors, envs, strict=True)]
            self.pids = tuple(ray.get(spawned, timeout=self.timeout))
            self._exits = {a.wait_exit.remote(): r for r, a in enumerate(self.actors)}
            self.placements = tuple(
                RankPlacement(r, self.workers[r], loc.node_ip, loc.node_id, loc.bundle_index, loc.gpu_ids)
                for r, loc in enumerate(self.bundles.locations)
            )
            self.address = self._wait_serving()
        except BaseException:
            self.teardown(grace=2.0)
            raise
        self._watch = threading.Thread(target=self._watch_ranks, name=f"meshrl-{self.name}-watch", daemon=True)
        self._watch.start()
        return self.address

    def _wait_serving(self) -> str:
        ray = self.ray
        serving = self.actors[0].serve.remote(self.timeout)
        ready, _ = ray.wait([serving, *self._exits], num_returns=1, timeout=self.timeout + 10)
        if not ready:
            raise DeadlineExceeded(
                f"trainer rank 0 did not serve within {self.timeout:.0f}s; see {self.log_path(0)}. Fix: check "
                "that every rank's node can reach rank 0's address, or raise services.start_timeout_seconds"
            )
        if ready[0] is serving:
            try:
                return ray.get(serving)
            except ray.exceptions.RayTaskError as exc:
                raise exc.as_instanceof_cause() from None
        rank = self._exits[ready[0]]
        tail = self.log_path(rank).read_text(errors="replace")[-2000:] if self.log_path(rank).exists() else ""
        raise start_failure(f"trainer rank {rank} {self._what(ready[0])} while the group started", tail)

    def _what(self, ref) -> str:
        rank = self._exits[ref]
        where = f"on {self.placements[rank].node_ip}" if self.placements else ""
        try:
            return f"{where} exited with {describe_exit(self.ray.get(ref))}".strip()
        except self.ray.exceptions.RayError as exc:
            return f"{where} lost its Ray actor (its node died, or the actor was killed): {type(exc).__name__}"

    def _watch_ranks(self) -> None:
        pending = list(self._exits)
        while pending and not self._closing.is_set():
            ready, pending = self.ray.wait(pending, num_returns=1, timeout=0.5)
            if ready and not self._closing.is_set():
                what = self._what(ready[0])
                log.error("trainer group '%s': rank %d %s", self.name, self._exits[ready[0]], what)
                if self.on_exit is not None:
                    self.on_exit(self._exits[ready[0]], what)
                return  # the group is lost: the others follow rank 0 or its collectives; one report says why

    def lost_rank(self, timeout: float = 10.0) -> str | None:
        """'rank R on ADDR ...' for the first rank whose process has ended or whose actor does not answer within
        `timeout` (lost with its node), else None. Asked when a call fails in a way a dead peer would explain."""
        ray = self.ray
        asked = {a.alive.remote(): r for r, a in enumerate(self.actors)}
        ready, late = ray.wait(list(asked), num_returns=len(asked), timeout=timeout)
        for ref in ready:
            try:
                if ray.get(ref):
                    continue
                what = "has ended"
            except ray.exceptions.RayError as exc:
                what = f"lost its Ray actor: {type(exc).__name__}"
            rank = asked[ref]
            return (
                f"rank {rank} on {self.placements[rank].node_ip} {what}" if self.placements else f"rank {rank} {what}"
            )
        if late:
            rank = asked[late[0]]
            return f"rank {rank} did not answer within {timeout:g}s (its node is gone or unreachable)"
        return None

    def teardown(self, grace: float = 10.0) -> None:
        """Stops rank 0 (it stops the other ranks), then the others, kills the actors and releases the bundles.
        Nothing is reported for ranks that end meanwhile."""
        self._closing.set()
        if self._watch is not None and self._watch is not threading.current_thread():
            self._watch.join()
        self._watch = None
        ray = self.ray
        for batch in (self.actors[:1], self.actors[1:]):
            try:
                ray.get([a.stop.remote(grace) for a in batch], timeout=grace + 15)
            except Exception as exc:  # noqa: BLE001 - a lost actor or node: kill what is left
                log.warning("stopping trainer group '%s': %s", self.name, exc)
        for actor in self.actors:
            ray.kill(actor)
        if self.bundles is not None:
            self.bundles.release()
        self.actors, self.bundles, self._exits, self.address, self.pids = [], None, {}, None, ()

    def recreate(self) -> str:
        """Tears the group down and creates it again on the same pins; returns rank 0's new address."""
        self.teardown()
        return self.create()
