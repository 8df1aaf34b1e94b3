"""The services of one job: launched (Ray actors or processes) or named by address, with the
clients the step loop uses. `JobServices.open` brings them up in order (data buffer first,
then trainer and rollout replicas, which need its address) and `close` stops what it started.
A launched service that dies is noticed from its exit (exit_watch.py; a trainer group's ranks by their actors,
trainer_group.py): the calls waiting on it fail at once. With `trainer.launch: group` the trainer's ranks are Ray
actors on the bundles the job's plan gives them (trainer_plan.py), and the events name each rank's node,
bundle and devices.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshrl.common.databuffer_client import DataBufferClient
from meshrl.common.peers import check_peer
from meshrl.common.registry import ReplicaRegistry
from meshrl.scheduler.clients import TrainerClient
from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.fleet.rollout_fleet import RolloutFleet
from meshrl.scheduler.launch.cpu_placement import CpuSets, cpu_sets, pin_thread, placed, unpin_thread
from meshrl.scheduler.launch.exit_watch import ExitWatch, describe_exit
from meshrl.scheduler.launch.group_client import GroupTrainerClient
from meshrl.scheduler.launch.launcher import ProcessLauncher, RayLauncher, ServiceSpec, overlapped_trainer_threads
from meshrl.scheduler.launch.whereabouts import whereabouts
from meshrl.scheduler.rundir import RunDir

if TYPE_CHECKING:
    from meshrl.scheduler.launch.trainer_group import TrainerGroup
    from meshrl.scheduler.launch.trainer_plan import PlannedRanks

log = logging.getLogger(__name__)


def telemetry_args(cfg: JobConfig, run: RunDir, name: str) -> list[str]:
    t = cfg.telemetry
    args = ["--set", f"telemetry.exporter={t.exporter}", "--set", f"telemetry.sample_ratio={t.sample_ratio}"]
    args += ["--set", f"telemetry.instance={name}"]
    if t.exporter == "file":
        args += ["--set", f"telemetry.path={run.traces / (name + '.jsonl')}"]
    return args


def roots_args(run: RunDir, model_path: str, extra: tuple[str, ...] = ()) -> list[str]:
    """A launched service may touch the run folder, the model folder and the `extra` folders only (its
    `paths.roots`); `extra` is e.g. the checkpoint `meshrl run --val-only --checkpoint` evaluates."""
    roots = [str(run.root), str(Path(model_path).resolve()), *(str(Path(p).resolve()) for p in extra)]
    return ["--set", "paths.roots=" + json.dumps(roots)]


def rollout_spec(
    cfg: JobConfig, run: RunDir, name: str, buffer_address: str, model_path: str, extra_roots: tuple[str, ...] = ()
) -> ServiceSpec:
    args = [
        *roots_args(run, model_path, extra_roots),
        "--set",
        f"engine.kind={cfg.rollout.engine}",
        "--set",
        f"engine.model_path={model_path}",
        "--set",
        f"engine.max_batch_size={cfg.rollout.max_batch_size}",
        "--set",
        f"databuffer_address={buffer_address}",
        "--set",
        f"replica_id={name}",
        *telemetry_args(cfg, run, name),
        # Its bundle's GPU is the only one it sees (CUDA_VISIBLE_DEVICES): the transformers engine uses it.
        *(["--set", "engine.transformers.device=cuda"] if cfg.rollout.gpus_per_replica >= 1 else []),
        # vLLM's "auto" dtype halves an fp32 model; the trainer's dtype is the one its log-probs are compared in
        *(["--set", f"engine.vllm.extra_args.dtype={cfg.model.dtype}"] if cfg.rollout.engine == "vllm" else []),
        # a launched engine server's own output beside the replica's log
        *(
            ["--set", f"engine.{cfg.rollout.engine}.log_file={run.logs / (name + '-' + cfg.rollout.engine + '.log')}"]
            if cfg.rollout.engine in ("vllm", "sglang")
            else []
        ),
        *[a for kv in cfg.rollout.service_overrides for a in ("--set", kv)],
    ]
    return ServiceSpec("rollout", name, args, gpus=cfg.rollout.gpus_per_replica, share=colocation(cfg))


def colocation(cfg: JobConfig) -> str:
    """The `ServiceSpec.share` of the trainer and the replicas: one bundle for all of them when colocated."""
    return "colocated" if cfg.services.placement == "colocated" else ""


def trainer_spec(
    cfg: JobConfig, run: RunDir, name: str, buffer_address: str, model_path: str, extra_roots: tuple[str, ...] = ()
) -> ServiceSpec:
    t = cfg.trainer
    args = [
        *roots_args(run, model_path, extra_roots),
        "--set",
        f"databuffer_address={buffer_address}",
        "--set",
        f"data_parallel.size={t.data_parallel}",
        "--set",
        f"parallel.tensor_parallel={t.tensor_parallel}",
        "--set",
        f"parallel.pipeline_parallel={t.pipeline_parallel}",
        *telemetry_args(cfg, run, name),
        *thread_split_args(cfg),
        *[a for kv in t.service_overrides for a in ("--set", kv)],
    ]
    return ServiceSpec("trainer", name, args, gpus=t.gpus)


def thread_split_args(cfg: JobConfig) -> list[str]:
    """training.split_threads in the overlapped modes (eta > 0: at eta 0 nothing overlaps, and the run stays the
    sync run exactly): the CPU trainer's torch_threads, so that it and the job's replicas on this host get
    disjoint cores (set before service_overrides, which win)."""
    overlapped = cfg.training.staleness > 0 and cfg.training.split_threads and not cfg.services.cpu_placement
    if not overlapped or cfg.trainer.gpus or cfg.rollout.gpus_per_replica:
        return []
    t = cfg.trainer
    ranks = t.data_parallel * t.tensor_parallel * t.pipeline_parallel
    threads = overlapped_trainer_threads(os.cpu_count() or 1, cfg.rollout.replicas, ranks)
    return ["--set", f"torch_threads={threads}"]


@dataclass
class JobServices:
    cfg: JobConfig
    run: RunDir
    model_path: str
    extra_roots: tuple[str, ...] = ()  # folders outside the run the services may read (a checkpoint to evaluate)
    launcher: RayLauncher | ProcessLauncher | None = None
    buffer: DataBufferClient | None = None
    trainer: TrainerClient | GroupTrainerClient | None = None
    fleet: RolloutFleet | None = None
    addresses: dict[str, str] = field(default_factory=dict)
    registry: ReplicaRegistry | None = None
    on_exit: Callable[[str], None] | None = None  # told (a sentence) when a launched service exits on its own
    workflow: Any = None  # the job's workflow: a trainer group's ranks go where its plan puts them
    on_event: Callable[[str], None] | None = None  # told (a sentence) where a trainer group's ranks run
    trainer_group: TrainerGroup | None = None
    cpu_sets: CpuSets | None = None  # the cores of each launched service under services.cpu_placement
    planned: PlannedRanks | None = None  # the plan a trainer group and the replicas follow (trainer.launch: group)
    _workers: dict[str, str] = field(default_factory=dict)  # launched replica -> its plan worker
    exits: dict[str, int] = field(default_factory=dict)  # name -> return code of launched services that died
    _next_replica: int = 0
    _watch: ExitWatch | None = None
    _pinned: tuple[int, set[int] | None] | None = None  # (job thread, its cores before) once place_job_thread ran

    def _launcher(self) -> RayLauncher | ProcessLauncher:
        """Started on first use: a job whose services are all named by address needs no Ray."""
        if self.launcher is None:
            s = self.cfg.services
            if s.use_ray:
                self.launcher = RayLauncher(self.run.logs, s.start_timeout_seconds, s.ray_address, s.placement_strategy)
            else:
                self.launcher = ProcessLauncher(self.run.logs, s.start_timeout_seconds)
        return self.launcher

    def open(self) -> JobServices:
        s = self.cfg.services
        self.place_job_thread()
        buffer_address = s.databuffer
        if buffer_address is None:
            redis = (
                ["--set", f"redis.url={s.redis_url}"]
                if s.redis_url
                else ["--set", f"redis.embedded.data_dir={self.run.root / 'redis'}"]
            )
            spec = ServiceSpec("databuffer", "databuffer", [*redis, *telemetry_args(self.cfg, self.run, "databuffer")])
            buffer_address = self._launcher().start([self._placed(spec)])["databuffer"]
        self.addresses["databuffer"] = buffer_address
        channels = s.channels
        self.buffer = DataBufferClient(buffer_address, channels.databuffer)
        check_peer("the data buffer", channels.databuffer, field="services.channels.databuffer", address=buffer_address)
        specs = []
        grouped = self.cfg.trainer.address is None and self.cfg.trainer.launch == "group"
        if self.cfg.trainer.address is None and not grouped:
            trainer = trainer_spec(self.cfg, self.run, "trainer", buffer_address, self.model_path, self.extra_roots)
            specs.append(self._placed(replace(trainer, share=colocation(self.cfg))))
        # Ray up before the plan reads its nodes and the group's thread uses it
        launcher = self._launcher() if specs or grouped or self.cfg.rollout.replicas else None
        if grouped and self.workflow is not None:
            self.planned = self._plan()
        for _ in range(self.cfg.rollout.replicas):
            specs.append(self._new_replica_spec(buffer_address))
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshrl-group") as pool:
            group = pool.submit(self._open_trainer_group, buffer_address) if grouped else None
            started = launcher.start(specs) if specs else {}
            if group is not None:
                started["trainer"] = group.result()
        self.addresses.update(started)
        if self.planned is not None:
            self._event(f"rollout replicas: {json.dumps(self._replica_rows(started))}")
        trainer_address = self.cfg.trainer.address or started["trainer"]
        self.addresses["trainer"] = trainer_address
        self.trainer = TrainerClient(trainer_address, self.cfg.trainer.request_timeout_seconds, channels.trainer)
        if self.trainer_group is not None:  # an internal error while a rank is gone fails as Unavailable
            self.trainer = GroupTrainerClient(self.trainer, self.trainer_group)
        check_peer("the trainer", channels.trainer, field="services.channels.trainer", address=trainer_address)
        self.trainer.wait_ready(s.start_timeout_seconds)
        replicas = [a for n, a in started.items() if n.startswith("rollout-")] + list(self.cfg.rollout.addresses)
        for address in replicas:
            check_peer(
                f"rollout replica {address}", channels.rollout, field="services.channels.rollout", address=address
            )
        self.addresses.update({f"rollout@{a}": a for a in self.cfg.rollout.addresses})
        self.registry = self._registry()
        self.fleet = RolloutFleet(
            self.buffer, replicas, self.cfg.rollout.request_timeout_seconds, channels.rollout, self.registry
        )
        if self.registry is not None and not replicas:
            self.fleet.adopt_pending(wait_for=1, timeout=s.start_timeout_seconds)
        if isinstance(self.launcher, ProcessLauncher):
            self._watch = ExitWatch(self.launcher, self._exited).start()
        return self

    def _plan(self) -> PlannedRanks:
        """The plan this run launches on the Ray cluster's alive nodes (`meshrl plan` with the same inputs)."""
        from meshrl.scheduler.launch.trainer_plan import plan_trainer_ranks

        t = self.cfg.trainer
        world = t.data_parallel * t.tensor_parallel * t.pipeline_parallel
        planned = plan_trainer_ranks(self.workflow, self.cfg.services.placement, world, "GPU" if t.gpus else "CPU")
        self._event(planned.describe())
        return planned

    def _replica_rows(self, started: dict[str, str]) -> list[dict]:
        """Each launched replica's plan worker and where Ray put it (the event beside `trainer ranks`)."""
        bundles = getattr(self.launcher, "bundles", {})
        return [
            {
                "name": n,
                "worker": self._workers.get(n, ""),
                "node": bundles[n][1].node_ip,
                "bundle": bundles[n][1].bundle_index,
            }
            for n in started
            if n.startswith("rollout-") and n in bundles
        ]

    def _open_trainer_group(self, buffer_address: str) -> str:
        """The trainer as a group of Ray actors, one per rank, each on the bundle of its planned worker (no
        workflow: bundles placed by services.placement_strategy); returns rank 0's address."""
        from meshrl.scheduler.launch.placement import worker_bundle
        from meshrl.scheduler.launch.trainer_group import TrainerGroup

        cfg, t = self.cfg, self.cfg.trainer
        world = t.data_parallel * t.tensor_parallel * t.pipeline_parallel
        gpus = t.gpus / world
        planned = self.planned
        spec = trainer_spec(cfg, self.run, "trainer", buffer_address, self.model_path, self.extra_roots)
        self.trainer_group = TrainerGroup(
            spec.args,
            world,
            self.run.logs,
            worker_bundle(1.0, gpus),
            planned.pins() if planned else None,
            planned.labels() if planned else None,
            strategy=cfg.services.placement_strategy,
            timeout=cfg.services.start_timeout_seconds,
            on_exit=self._rank_exited,
        )
        address = self.trainer_group.create()
        ranks = [p.as_dict() for p in self.trainer_group.placements]
        self._event(f"trainer ranks: {json.dumps(ranks)}")
        return address

    def _event(self, message: str) -> None:
        log.info(message)
        if self.on_event is not None:
            self.on_event(message)

    def _rank_exited(self, rank: int, what: str) -> None:
        log_path = self.trainer_group.log_path(rank) if self.trainer_group else self.run.logs / "trainer.log"
        self.exits["trainer"] = -1
        self._lost("trainer", f"rank {rank} {what}", log_path)

    def _exited(self, name: str, code: int) -> None:
        self.exits[name] = code
        self._lost(name, f"exited with {describe_exit(code)}", self.run.logs / (name + ".log"))

    def _lost(self, name: str, what: str, log_path: Path) -> None:
        """A launched service ended without being stopped. Every step needs the trainer and the data buffer:
        the calls waiting on a dead one fail now (the trainer's too when the data buffer died: its handlers
        wait on the buffer), and the job's recovery restarts the services. A dead replica gets no more work: its
        rows go to the other replicas, and when it was the last one the step fails at once (and restarts)."""
        message = f"{name} {what} (its log: {log_path})"
        cut = {"trainer": (self.trainer,), "databuffer": (self.trainer, self.buffer)}.get(name, ())
        if cut:
            message += "; the calls waiting on it fail now, and the job restarts its services (job.max_restarts)"
        for client in cut:
            if client is not None:
                client.close()
        if name.startswith("rollout-") and self.fleet is not None and name in self.addresses:
            self.fleet.exited(self.addresses[name])
            message += "; it gets no more work (the job restarts its services when it was the last replica)"
        log.error(message)
        if self.on_exit is not None:
            self.on_exit(message)

    def _registry(self) -> ReplicaRegistry | None:
        reg = self.cfg.rollout.registry
        if reg.redis_url is None:
            return None
        token = self.cfg.services.channels.rollout.auth.token()  # the replicas' token: only their entries count
        return ReplicaRegistry(reg.redis_url, namespace=reg.namespace, token=token)

    def _new_replica_spec(self, buffer_address: str) -> ServiceSpec:
        """The next replica's spec, pinned to its plan worker's node when the run follows a plan."""
        index, name = self._next_replica, f"rollout-{self._next_replica}"
        self._next_replica += 1
        spec = rollout_spec(self.cfg, self.run, name, buffer_address, self.model_path, self.extra_roots)
        pins = self.planned.replica_pins(index + 1) if self.planned is not None else []
        if pins:
            self._workers[name], pin = pins[index]
            spec = replace(spec, pin=pin, worker=self._workers[name])
        return self._placed(spec)

    def place_job_thread(self) -> None:
        """Under services.cpu_placement: puts the calling thread (the job's: every thread and process it starts
        from now on, the step loop, the producer, reward workers) on the cores of `others`; `close` gives it back
        its own. Called by the runner before it starts the reward workers, and by `open`."""
        sets = self._cpu_sets()
        if sets is not None and self._pinned is None:
            self._pinned = (threading.get_ident(), pin_thread(sets.others))

    def _cpu_sets(self) -> CpuSets | None:
        """The cores of each launched service and of the rest of the job (worked out once), or None without
        services.cpu_placement."""
        if self.cfg.services.cpu_placement is None:
            return None
        if self.cpu_sets is None:
            self.cpu_sets = cpu_sets(self.cfg.services.cpu_placement, self.cfg.rollout.replicas)
            self._event(f"CPU placement: {json.dumps(self.cpu_sets.as_dict())}")
        return self.cpu_sets

    def _placed(self, spec: ServiceSpec) -> ServiceSpec:
        """The spec on its own cores under services.cpu_placement (launch/cpu_placement.py), else as it is."""
        sets = self._cpu_sets()
        if sets is None:
            return spec
        t = self.cfg.trainer
        ranks = t.data_parallel * t.tensor_parallel * t.pipeline_parallel
        return placed(spec, sets, self.cfg.rollout.engine, ranks)

    def add_replicas(self, count: int) -> list[str]:
        """Starts `count` replicas; they are not given traffic until the caller refits them."""
        specs = [self._new_replica_spec(self.addresses["databuffer"]) for _ in range(count)]
        started = self._launcher().start(specs)
        self.addresses.update(started)
        return list(started.values())

    def remove_replica(self, address: str) -> None:
        name = next((n for n, a in self.addresses.items() if a == address), None)
        self.fleet.remove(address)
        if name is not None and self.launcher is not None:
            self.launcher.stop(name)
            del self.addresses[name]

    def placements(self) -> list[dict]:
        """Where each launched service runs now (launch/whereabouts.py): rows of the Placement message."""
        ranks = self.trainer_group.placements if self.trainer_group is not None else ()
        replicas = self.fleet.addresses() if self.fleet is not None else ()
        bundles = getattr(self.launcher, "bundles", {})
        return whereabouts(dict(self.addresses), bundles, ranks, replicas, dict(self._workers))

    def shared_bundle(self) -> str:
        """Where colocated services run: each one's placement group, bundle index and GPU ids (Ray launcher)."""
        placed = getattr(self.launcher, "bundles", {})
        return ", ".join(
            f"{name}: group {pg[:8]} bundle {loc.bundle_index} GPUs {list(loc.gpu_ids)}"
            for name, (pg, loc) in placed.items()
            if name != "databuffer"
        )

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()  # what is stopped from here on is stopped on purpose
        for client in (self.fleet, self.trainer, self.buffer):
            if client is not None:
                try:
                    client.close()
                except Exception as exc:  # noqa: BLE001 - closing must go on
                    log.warning("closing %s: %s", type(client).__name__, exc)
        if self.trainer_group is not None:
            self.trainer_group.teardown()  # before the launcher, which may shut its Ray down
        if self.launcher is not None:
            self.launcher.stop_all()
        if self._pinned is not None and self._pinned[0] == threading.get_ident():
            unpin_thread(self._pinned[1])
            self._pinned = None
