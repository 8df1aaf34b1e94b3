"""Starting the job's services: as Ray actors pinned to placement-group bundles (each actor
runs its service's process and reports its address), or as plain local processes.

Services deployed independently are not launched: the job config names their addresses
and the scheduler only connects.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from meshrl.common.errors import FailedPrecondition
from meshrl.scheduler.launch.local_ray import init_local_ray
from meshrl.scheduler.launch.placement import (
    BundleLocation,
    bundle_shares,
    create_pinned_bundles,
    create_worker_bundles,
    launch_pinned,
    worker_bundle,
)
from meshrl.scheduler.launch.process import ServiceProcess

log = logging.getLogger(__name__)


@dataclass
class ServiceSpec:
    service: str  # "databuffer" | "trainer" | "rollout"
    name: str  # unique instance name, e.g. "rollout-1"
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cpus: float = 1.0
    gpus: float = 0.0
    share: str = ""  # instances with the same `share` are colocated: one bundle, its devices seen by each
    pin: dict[str, float] = field(default_factory=dict)  # a node's own resource: its bundle on the planned node
    worker: str = ""  # the plan's worker it was pinned for ("n0:1"), "" unplanned


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """Services use every core by default (Ray would give its workers OMP_NUM_THREADS=1); idle OpenMP
    threads sleep instead of spinning, so colocated services do not steal each other's cores."""
    threads = str(os.cpu_count() or 1)
    return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OMP_WAIT_POLICY": "PASSIVE", **extra}


def overlapped_trainer_threads(cores: int, replicas: int, ranks: int = 1) -> int:
    """Torch threads of each rank of a CPU trainer whose replicas generate at the same time
    (training.split_threads): the cores the replicas' one thread each leave, shared by the ranks, at
    least one. On 2 cores the trainer otherwise runs 2 threads beside the replica's one (bench/async)."""
    return max(1, (cores - replicas) // max(1, ranks))


class ProcessLauncher:
    """Services as child processes of the scheduler (`services.use_ray: false`, `meshrl up`)."""

    def __init__(self, logs: Path, start_timeout: float) -> None:
        self.logs = logs
        self.timeout = start_timeout
        self.procs: dict[str, ServiceProcess] = {}
        self.batches: list[list[str]] = []  # names, by the `start` call that started them

    def start(self, specs: list[ServiceSpec]) -> dict[str, str]:
        """Starts `specs` together (the trainer and the replicas import torch and load the model at once) and
        returns their addresses; the first failure, in spec order, is raised once every start has ended. What
        started is kept for `stop_all`, as is what failed."""
        for spec in specs:
            log_path = str(self.logs / f"{spec.name}.log")
            self.procs[spec.name] = ServiceProcess(spec.service, spec.args, log_path, child_env(spec.env))
        if not specs:
            return {}
        self.batches.append([spec.name for spec in specs])
        with ThreadPoolExecutor(max_workers=len(specs), thread_name_prefix="meshrl-start") as pool:
            started = {s.name: pool.submit(self.procs[s.name].start, self.timeout) for s in specs}
        for future in started.values():
            if future.exception() is not None:
                raise future.exception()
        return {name: future.result() for name, future in started.items()}

    def pid(self, name: str) -> int | None:
        return self.procs[name].pid

    def stop(self, name: str, grace: float = 10.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            proc.stop(grace)

    def stop_all(self, grace: float = 10.0) -> None:
        """Stops the batches in the reverse of their start order (the data buffer after what uses it), the
        services of one batch together."""
        for batch in reversed(self.batches):
            with ThreadPoolExecutor(max_workers=len(batch), thread_name_prefix="meshrl-stop") as pool:
                list(pool.map(lambda name: self.stop(name, grace), batch))
        self.batches.clear()
        for name in list(self.procs)[::-1]:  # none left unless a caller filled `procs` itself
            self.stop(name, grace)


def on_node(args: list[str], env: dict[str, str], node_ip: str, gpu_ids: list) -> tuple[list[str], dict[str, str]]:
    """A service placed on a Ray node binds (and so advertises) the node's address, unless its args
    name a host, and sees only its bundle's GPUs (CUDA_VISIBLE_DEVICES; none when the bundle has none)."""
    named = "--host" in args or any(a.startswith("server.host=") for a in args)
    args = list(args) if named else [*args, "--host", node_ip]
    env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(int(float(g))) for g in gpu_ids)}
    return args, env


class _ServiceActorImpl:
    """Body of the Ray actor that owns one service process on its bundle."""

    def __init__(self, service: str, args: list[str], log_path: str, env: dict[str, str], gpu_ids: list) -> None:
        import ray

        # The bundle's GPU ids (its probe's), not the actor's own claim: colocated actors claim a share, or
        # none where Ray cannot split the bundle's GPUs (see `bundle_shares`), and still see all of them.
        args, env = on_node(args, env, ray.util.get_node_ip_address(), gpu_ids)
        self.proc = ServiceProcess(service, args, log_path, env)

    def start(self, timeout: float) -> str:
        return self.proc.start(timeout)

    def placement(self) -> dict:
        import ray

        ctx = ray.get_runtime_context()
        return {"node_ip": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id(), "pid": self.proc.pid}

    def stop(self, grace: float) -> int | None:
        return self.proc.stop(grace)


class RayLauncher:
    """Services as Ray actors on placement groups (slime's layout): one bundle per instance."""

    def __init__(self, logs: Path, start_timeout: float, address: str | None, strategy: str) -> None:
        import ray

        self.ray = ray
        self.logs = logs
        self.timeout = start_timeout
        self.strategy = strategy
        self.owns_ray = not ray.is_initialized() and address is None
        self.temp_dir: str | None = None
        if ray.is_initialized() and address and ray.get_runtime_context().gcs_address != address:
            raise FailedPrecondition(
                f"this scheduler is connected to the Ray cluster at {ray.get_runtime_context().gcs_address}, but the "
                f"job asks for services.ray_address = {address!r}. Fix: run the job on a scheduler started against "
                "that cluster, or leave services.ray_address unset to use the connected one"
            )
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                self.temp_dir = tempfile.mkdtemp(prefix="meshrl-ray-")
                init_local_ray(
                    ray,
                    num_cpus=32,
                    include_dashboard=False,
                    log_to_driver=False,
                    _node_ip_address="127.0.0.1",
                    _temp_dir=self.temp_dir,
                )
        self.actor_cls = ray.remote(_ServiceActorImpl)
        self.actors: dict[str, object] = {}
        self.groups: list[object] = []
        self.placements: dict[str, dict] = {}
        self.bundles: dict[str, tuple[str, BundleLocation]] = {}  # name -> (placement group id, its bundle)

    def start(self, specs: list[ServiceSpec]) -> dict[str, str]:
        """One placement group per kind of bundle (one bundle per instance), bundles ordered by node and device
        (placement.py); the instances of one `share` get a single bundle together (`bundle_shares`)."""
        by_bundle: dict[tuple, list[ServiceSpec]] = {}
        for spec in specs:
            by_bundle.setdefault(("share", spec.share) if spec.share else (spec.cpus, spec.gpus), []).append(spec)
        pending = {}
        for key, group in by_bundle.items():
            shared = key[0] == "share"
            bundle = worker_bundle(max(s.cpus for s in group), max(s.gpus for s in group))
            if not shared and any(s.pin for s in group):  # where the plan put them: bundle i is instance i's
                bundles = create_pinned_bundles([s.pin for s in group], bundle, self.strategy, timeout_s=self.timeout)
            else:
                count = 1 if shared else len(group)
                bundles = create_worker_bundles(count, bundle, self.strategy, timeout_s=self.timeout)
            self.groups.append(bundles)
            cpus, gpus = bundle_shares(bundle, len(group)) if shared else (0.0, 0.0)
            for i, spec in enumerate(group):
                worker = 0 if shared else i
                log_path = str(self.logs / f"{spec.name}.log")
                actor = launch_pinned(
                    self.actor_cls,
                    bundles,
                    worker,
                    spec.service,
                    spec.args,
                    log_path,
                    child_env(spec.env),
                    list(bundles.locations[worker].gpu_ids),
                    name=f"meshrl-{spec.name}-{os.getpid()}",
                    num_cpus=cpus,
                    num_gpus=gpus,
                )
                self.actors[spec.name] = actor
                self.bundles[spec.name] = (bundles.placement_group.id.hex(), bundles.locations[worker])
                pending[spec.name] = actor.start.remote(self.timeout)
        addresses = {}
        for name, ref in pending.items():
            try:
                addresses[name] = self.ray.get(ref, timeout=self.timeout + 10)
            except self.ray.exceptions.RayTaskError as exc:
                raise exc.as_instanceof_cause() from None
            self.placements[name] = self.ray.get(self.actors[name].placement.remote())
        return addresses

    def pid(self, name: str) -> int | None:
        return self.placements.get(name, {}).get("pid")

    def stop(self, name: str, grace: float = 10.0) -> None:
        actor = self.actors.pop(name, None)
        if actor is None:
            return
        try:
            self.ray.get(actor.stop.remote(grace), timeout=grace + 15)
        finally:
            self.ray.kill(actor)

    def stop_all(self, grace: float = 10.0) -> None:
        for name in list(self.actors)[::-1]:
            try:
                self.stop(name, grace)
            except Exception as exc:  # noqa: BLE001 - keep stopping the others
                log.warning("stopping %s: %s", name, exc)
        for bundles in self.groups:
            bundles.release()
        self.groups.clear()
        if self.owns_ray:
            self.ray.shutdown()
            if self.temp_dir:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
