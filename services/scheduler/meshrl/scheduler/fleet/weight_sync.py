"""Publishing the actor's new weights to every rollout replica after a train step, and
proving they arrived: every replica must report the new version and the same checksums
as the trainer, or the update fails loudly. Transports: `disk` (versioned safetensors
folder) and `distributed` (a torch.distributed group, NCCL or gloo, built once and rebuilt
without members that stop answering). The group's backend follows the members' devices
(`comm_backend.resolve_backend`), its protocol the replicas' engines (`group_layout`).
"""

from __future__ import annotations

import contextvars
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from meshrl.api.common.v1 import weights_pb2 as wpb
from meshrl.api.rollout.v1 import rollout_pb2 as rpb
from meshrl.api.trainer.v1 import trainer_pb2 as tpb
from meshrl.common import telemetry
from meshrl.common.comm_backend import resolve_backend
from meshrl.common.errors import ConfigError, DataLoss, FailedPrecondition, MeshrlError
from meshrl.common.telemetry import attributes as A
from meshrl.common.weight_group_codes import BACKENDS, PROTOCOLS
from meshrl.scheduler.clients import RolloutClient, TrainerClient
from meshrl.scheduler.config import WeightsSection
from meshrl.scheduler.inline import run_inline

log = logging.getLogger(__name__)
PAUSE = {"abort": wpb.PAUSE_MODE_ABORT, "in_place": wpb.PAUSE_MODE_IN_PLACE}


NATIVE_ENGINES = ("sglang", "vllm")


@dataclass
class PublishResult:
    version: int
    seconds: float
    bytes: int
    stale: list[str] = field(default_factory=list)
    disk: wpb.DiskWeights | None = None
    backend: str = ""  # of the weight group that carried it ("" for disk)


@dataclass(frozen=True)
class GroupLayout:
    """One weight group: backend, protocol, each replica's first rank, the world size (trainer = rank 0),
    whether its updates go as deltas (weights.delta, and every replica applies them), and whether an engine
    group's store is sealed (every replica a vLLM server, whose ranks are meshrl's worker extension)."""

    backend: str
    protocol: str
    offsets: tuple[int, ...]
    world_size: int
    deltas: bool = False
    sealed: bool = False


def group_layout(cfg: WeightsSection, trainer_device: str, replicas: list[rpb.RolloutStatus]) -> GroupLayout:
    """The weight group of the trainer and `replicas` (their status): NCCL when every member holds a CUDA
    device (weights.backend auto); the engines' own protocol when every replica is an SGLang / vLLM server,
    each then holding one rank per tensor-parallel worker (weights.protocol auto). Deltas only when every replica
    applies them: an SGLang / vLLM replica refuses every delta, even relayed on meshrl's protocol, and would
    cost the group a delta and a complete version on every update."""
    devices = [trainer_device or "cpu", *(s.device or "cpu" for s in replicas)]
    backend = resolve_backend(cfg.backend, "weights.backend", devices)
    protocol = cfg.protocol
    if protocol == "auto":
        protocol = "engine" if replicas and all(s.engine in NATIVE_ENGINES for s in replicas) else "meshrl"
    ranks = [max(1, s.weight_ranks) if protocol == "engine" else 1 for s in replicas]
    offsets = tuple(1 + sum(ranks[:i]) for i in range(len(ranks)))
    deltas = cfg.delta and protocol == "meshrl" and not any(s.engine in NATIVE_ENGINES for s in replicas)
    sealed = protocol == "engine" and all(s.engine == "vllm" for s in replicas)
    return GroupLayout(backend, protocol, offsets, 1 + sum(ranks), deltas, sealed)


def _submit(pool: ThreadPoolExecutor, fn, *args):
    """Runs `fn` in the pool inside the caller's trace context (threads do not inherit it)."""
    return pool.submit(contextvars.copy_context().run, fn, *args)


def _failed(futures: dict, what: str) -> dict[str, MeshrlError]:
    """Waits for every future; returns the keys (addresses) whose call raised, with the error."""
    failed = {}
    for address, future in futures.items():
        try:
            future.result()
        except MeshrlError as exc:
            log.error("%s could not %s: %s", address, what, exc)
            failed[address] = exc
    return failed


def _unresponsive(failures: dict[str, MeshrlError], replicas: list[RolloutClient]) -> list[str]:
    """Of the replicas that missed an update, those that do not answer a status call within 2 s
    (frozen, dead, partitioned). The others failed because of them and are tried again."""
    by_address = {r.address: r for r in replicas}
    silent = []
    for address in failures:
        try:
            by_address[address].status(timeout=2.0)
        except MeshrlError:
            silent.append(address)
    return silent or list(failures)


def rendezvous(trainer_address: str, cfg: WeightsSection) -> tuple[str, int]:
    """The weight group's master address and port: on the trainer's host (rank 0 hosts the rendezvous).
    `weights.group_port` fixes the port (the trainer's `collective` port in Kubernetes); 0 picks a free
    one, which this process can only do when the trainer's host is one of its own addresses."""
    host = cfg.group_address or trainer_address.rsplit(":", 1)[0].strip("[]")
    if cfg.group_port:
        return host, cfg.group_port
    try:
        with socket.socket() as s:
            s.bind((host, 0))
            return host, s.getsockname()[1]
    except OSError as exc:
        raise ConfigError(
            "weights.group_port",
            0,
            f"a free port on the trainer's host {host} cannot be picked from here ({exc})",
            "set weights.group_port to a port open on the trainer's host (Kubernetes: 29500)",
        ) from None


class WeightPublisher:
    def __init__(self, trainer: TrainerClient, cfg: WeightsSection, disk_root: str) -> None:
        self.trainer = trainer
        self.cfg = cfg
        self.disk_root = disk_root
        self.backend = ""  # of the current weight group
        self.version = 0
        self.last_disk: wpb.DiskWeights | None = None
        self.published_checksums: wpb.WeightChecksums | None = None  # of the last publish reply
        self._replied: dict[str, wpb.WeightChecksums] = {}  # address -> checksums its last update reply carried
        self._group: str | None = None
        self._group_members: tuple[str, ...] = ()
        self._group_deltas = False  # the current group's layout.deltas
        self._generation = 0

    # -- disk ---------------------------------------------------------------------------
    def _publish_disk(self, version: int, delta: bool = False) -> tpb.PublishWeightsResponse:
        req = tpb.PublishWeightsRequest(
            delta=delta,
            max_delta_fraction=self.cfg.max_delta_fraction,
            role=tpb.ROLE_ACTOR,
            transport=wpb.WEIGHT_TRANSPORT_DISK,
            version=version,
            disk_root=self.disk_root,
            keep_last=self.cfg.keep_last,
            bucket_bytes=self.cfg.bucket_bytes,
            timeout_seconds=self.cfg.timeout_seconds,
        )
        reply = self.trainer.publish(req, timeout=self.cfg.timeout_seconds)
        self.last_disk = reply.disk
        self._remember_checksums(reply)
        return reply

    def _remember_checksums(self, reply: tpb.PublishWeightsResponse) -> None:
        """The checksums a publish reply carried: `verify` compares replicas with them (no second trainer call)."""
        if reply.checksums.sha256:
            self.published_checksums = reply.checksums

    def refit_from_disk(self, replica: RolloutClient) -> None:
        """Brings one replica (new, restarted or stale) to the current version, then verifies it.
        The last disk version can be behind (later versions went over the collective): then the
        current version is written to disk first, so a refit never loads an old one."""
        last = self.last_disk
        if last is None or not last.path or last.version != self.version or last.delta:
            self._publish_disk(self.version)
        flush = self.cfg.flush_cache != "never"
        self._update_from_disk(replica, self.last_disk, PAUSE[self.cfg.pause_mode], flush, self.cfg.timeout_seconds)
        if self.cfg.verify_checksums:
            self.verify([replica], self.version)

    def _checksum_names(self) -> list[str]:
        """The tensors an update reply should carry checksums of: those of the last publish reply (the trainer's
        sample is the same every version), none before the first or when checksums are not verified."""
        if not self.cfg.verify_checksums or self.published_checksums is None:
            return []
        return list(self.published_checksums.sha256)

    def _update_from_disk(self, replica: RolloutClient, *args) -> None:
        reply = replica.update_from_disk(*args, checksum_names=self._checksum_names())
        self._replied[replica.address] = reply.checksums

    def _update_from_distributed(self, replica: RolloutClient, *args) -> None:
        reply = replica.update_from_distributed(*args, checksum_names=self._checksum_names())
        self._replied[replica.address] = reply.checksums

    # -- distributed --------------------------------------------------------------------
    def _ensure_group(self, replicas: list[RolloutClient]) -> tuple[str, dict[str, MeshrlError]]:
        """The weight-update group of the trainer and `replicas`, built anew when the members changed.
        Returns its name and the replicas that did not join in time (the group is then not built)."""
        members = tuple(r.address for r in replicas)
        if self._group and members == self._group_members:
            return self._group, {}
        if self._group:
            self._destroy_group(replicas)
        self._generation += 1
        name = f"meshrl-weights-{self._generation}"
        host, port = rendezvous(self.trainer.address, self.cfg)
        timeout = self.cfg.timeout_seconds
        layout = group_layout(self.cfg, self.trainer.status().device, [r.status() for r in replicas])
        self.backend, self._group_deltas = layout.backend, layout.deltas

        def group(offset: int) -> wpb.CollectiveGroup:
            return wpb.CollectiveGroup(
                master_address=host,
                master_port=port,
                world_size=layout.world_size,
                rank_offset=offset,
                group_name=name,
                backend=BACKENDS[layout.backend],
                timeout_seconds=timeout,
                protocol=PROTOCOLS[layout.protocol],
                sealed=layout.sealed,
            )

        with ThreadPoolExecutor(len(replicas) + 1) as pool:
            trainer_f = _submit(pool, self.trainer.init_weight_group, group(0), timeout + 10)
            joins = {
                r.address: _submit(pool, r.init_weight_group, group(offset), timeout + 10)
                for offset, r in zip(layout.offsets, replicas)
            }
            missing = _failed(joins, f"join weight group {name}")
            host_failed = _failed({self.trainer.address: trainer_f}, f"host weight group {name}")
        self._group, self._group_members = name, members
        if missing or host_failed:
            self._destroy_group([r for r in replicas if r.address not in missing])
            return name, missing or {r.address: host_failed[self.trainer.address] for r in replicas}
        return name, {}

    def _destroy_group(self, replicas: list[RolloutClient]) -> None:
        name, self._group, self._group_members = self._group, None, ()
        for client in [self.trainer, *replicas]:
            try:  # short: a member that does not answer is being left out anyway
                client.destroy_weight_group(name, timeout=5.0)
            except MeshrlError as exc:
                log.warning("destroying weight group %s on %s: %s", name, client.address, exc)

    def _send_once(self, version: int, replicas: list[RolloutClient]) -> tuple[int, dict[str, MeshrlError]]:
        """One broadcast of `version` to the group of `replicas`: (bytes sent, replicas that missed it). A delta
        refused by replicas that do not hold its base goes again at once, complete, to the whole group (the
        trainer holds the version as its base by then), so they are refitted within this publish."""
        name, missing = self._ensure_group(replicas)
        if missing:
            return 0, missing
        nbytes, failed = self._broadcast(name, version, replicas)
        if failed and self._group_deltas and all(isinstance(e, FailedPrecondition) for e in failed.values()):
            log.warning(
                "weight version %d: %s refused the delta (%s); sending it complete",
                version,
                sorted(a for a in failed if a != self.trainer.address),
                next(iter(failed.values())),
            )
            refit_bytes, failed = self._broadcast(name, version, replicas)
            nbytes += refit_bytes
        if failed:
            self._destroy_group(replicas)  # a broken group is never reused
            by_replica = {a: e for a, e in failed.items() if a != self.trainer.address}
            return 0, by_replica or {r.address: failed[self.trainer.address] for r in replicas}
        return nbytes, {}

    def _broadcast(self, name: str, version: int, replicas: list[RolloutClient]) -> tuple[int, dict[str, MeshrlError]]:
        """The trainer sends `version` (a delta when weights.delta) while every replica receives it: (bytes sent,
        the members whose call failed, the trainer under its own address)."""
        flush = self.cfg.flush_cache != "never"
        timeout = self.cfg.timeout_seconds
        req = tpb.PublishWeightsRequest(
            role=tpb.ROLE_ACTOR,
            transport=wpb.WEIGHT_TRANSPORT_DISTRIBUTED,
            version=version,
            bucket_bytes=self.cfg.bucket_bytes,
            group_name=name,
            timeout_seconds=timeout,
            delta=self._group_deltas,
            max_delta_fraction=self.cfg.max_delta_fraction,
        )
        with ThreadPoolExecutor(len(replicas) + 1) as pool:
            # Receivers join first (they block in the broadcast), then the trainer sends.
            receivers = {
                r.address: _submit(
                    pool, self._update_from_distributed, r, name, version, PAUSE[self.cfg.pause_mode], flush, timeout
                )
                for r in replicas
            }
            sent = _submit(pool, self.trainer.publish, req, timeout + 10)
            failed = _failed(receivers, f"receive weight version {version}")
            failed |= _failed({self.trainer.address: sent}, f"send weight version {version}")
        if failed:
            return 0, failed
        self._remember_checksums(sent.result())
        return sent.result().bytes, {}

    def _publish_distributed(self, version: int, replicas: list[RolloutClient]) -> tuple[int, list[str]]:
        """Broadcasts `version`; a replica that does not join or answer in time is left out (stale) and
        the others get the version over a fresh group without it, within the same call."""
        live, stale = list(replicas), []
        for _attempt in range(3):
            nbytes, failures = self._send_once(version, live)
            if not failures:
                return nbytes, stale
            out = _unresponsive(failures, live)
            stale += out
            live = [r for r in live if r.address not in out]
            if not live:
                break
        return 0, stale + [r.address for r in live]

    # -- both ---------------------------------------------------------------------------
    def publish(self, replicas: list[RolloutClient]) -> PublishResult:
        version = self.version + 1
        start = time.perf_counter()
        self._replied.clear()
        with telemetry.tracer().start_as_current_span(
            "weights.publish",
            attributes={A.TRANSPORT: self.cfg.transport, A.WEIGHT_VERSION: version},
        ) as span:
            stale: list[str] = []
            if self.cfg.transport == "disk":
                reply = self._publish_disk(version, delta=self.cfg.delta)
                nbytes = reply.disk.delta_bytes if reply.disk.delta else reply.bytes
                failed = self._load_disk(reply.disk, replicas, version)
                if reply.disk.delta and failed:  # missed the base (or cannot apply deltas): a complete version
                    self.version = version
                    stale = self._refit_all([r for r in replicas if r.address in failed])
                else:
                    stale = list(failed)
            else:
                nbytes, stale = self._publish_distributed(version, replicas)
            self.version = version
            live = [r for r in replicas if r.address not in stale]
            if self.cfg.verify_checksums:
                self.verify(live, version)
            backend = self.backend if self.cfg.transport == "distributed" else ""
            span.set_attribute(A.BYTES, nbytes)
            span.set_attribute("meshrl.weights.stale_replicas", len(stale))
            span.set_attribute("meshrl.weights.backend", backend)
        return PublishResult(version, time.perf_counter() - start, nbytes, stale, self.last_disk, backend)

    def _load_disk(self, disk: wpb.DiskWeights, replicas: list[RolloutClient], version: int) -> dict[str, MeshrlError]:
        """Every replica loads the published version `disk`, concurrently; returns those that failed. One
        replica loads from this thread (a pool thread would cost a start and two hand-offs per step)."""
        args = (disk, PAUSE[self.cfg.pause_mode], self.cfg.flush_cache != "never", self.cfg.timeout_seconds)
        if len(replicas) == 1:
            done = run_inline(self._update_from_disk, replicas[0], *args)
            return _failed({replicas[0].address: done}, f"load weight version {version}")
        with ThreadPoolExecutor(max(1, len(replicas))) as pool:
            futures = {r.address: _submit(pool, self._update_from_disk, r, *args) for r in replicas}
            return _failed(futures, f"load weight version {version}")

    def _refit_all(self, replicas: list[RolloutClient]) -> list[str]:
        """Refits replicas that refused a delta with a complete version; returns those that still failed."""
        stale = []
        for replica in replicas:
            try:
                self.refit_from_disk(replica)
            except MeshrlError as exc:
                log.error(
                    "replica %s could not be refitted with weight version %d: %s", replica.address, self.version, exc
                )
                stale.append(replica.address)
        return stale

    def verify(self, replicas: list[RolloutClient], version: int) -> None:
        """Every replica serves `version` with the trainer's checksums (those its publish reply carried; asked
        for only when that reply had none), or DataLoss names who differs. A replica's are those its update
        reply carried, taken after the update with the version it then served; asked for (one call, version
        and checksums taken together) when that reply had other ones or none."""
        expected = self.published_checksums
        if expected is None or expected.version != version:
            expected = self.trainer.checksums("actor")
        for replica in replicas:
            got = self._replied.pop(replica.address, None)
            if got is None or got.version != version or set(got.sha256) != set(expected.sha256):
                got = replica.checksums(list(expected.sha256))
            if got.version != version:
                raise DataLoss(f"replica {replica.address} serves weight version {got.version}, expected {version}")
            diff = sorted(k for k in expected.sha256 if got.sha256.get(k) != expected.sha256[k])
            if diff:
                raise DataLoss(f"replica {replica.address} has different weights than the trainer for {diff[:5]}")
