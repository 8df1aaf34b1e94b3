"""The job's rollout fleet: the router that spreads a prompt batch over the replicas (each
writes its own output shard), plus per-replica clients for weight updates and status.

Members come from the scheduler's launcher, from `rollout.addresses`, and from the replica
registry: a replica that registers while the job runs waits in `pending` until the step loop
refits and verifies it (`admit`), and one that drains (SIGTERM, `kubectl scale`, HPA) or whose
heartbeat stops leaves the routing at once, its work in flight finishing or retried elsewhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from meshrl.api.common.v1 import keys_pb2
from meshrl.common.batch_key import batch_key
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.common.errors import MeshrlError, Unavailable
from meshrl.common.grpc_channel import ChannelConfig
from meshrl.common.peers import check_peer
from meshrl.common.registry import DRAINING, SERVING, STALE, ReplicaInfo, ReplicaRegistry
from meshrl.scheduler.clients import RolloutClient
from meshrl.scheduler.fleet.router import RolloutRouter

log = logging.getLogger(__name__)
PEER_FIELD = "services.channels.rollout"
JOINABLE = (SERVING, STALE)  # loaded its model: a refit brings it to the job's version


class RolloutFleet:
    def __init__(
        self,
        buffer: DataBufferClient,
        addresses: list[str],
        timeout: float,
        channel: ChannelConfig | None = None,
        registry: ReplicaRegistry | None = None,
    ) -> None:
        self.buffer = buffer
        self.timeout = timeout
        self.channel = channel or ChannelConfig()
        router_channel = self.channel.model_copy(update={"retry_max_attempts": 1})
        self.router = RolloutRouter(
            addresses=addresses,
            databuffer=buffer,
            rpc_timeout_s=timeout,
            channel_config=router_channel,
            allow_empty=registry is not None,
        )
        self.router.on_behind = self._found_behind
        self._clients = {a: self._client(a) for a in addresses}
        self._stale: set[str] = set()  # missed a weight update: no traffic until refitted
        self._lock = threading.Lock()
        self.pending: dict[str, ReplicaInfo] = {}  # registered, not yet refitted and verified
        self.leaving: dict[str, float] = {}  # drained or dead: address -> monotonic time it left the routing
        self.registered: set[str] = set()  # members that came from the registry (not launched by us)
        self._watcher = registry.watch(self._on_listing) if registry is not None else None

    def _client(self, address: str) -> RolloutClient:
        return RolloutClient(address, self.timeout, self.channel)

    def addresses(self) -> list[str]:
        return list(self._clients)

    def clients(self) -> list[RolloutClient]:
        """Replicas that serve the current weights (stale ones and those leaving excluded)."""
        return [c for a, c in self._clients.items() if a not in self._stale and a not in self.leaving]

    def stale(self) -> list[RolloutClient]:
        return [self._clients[a] for a in self._stale if a in self._clients]

    def mark_stale(self, address: str) -> None:
        self._stale.add(address)
        self._route()

    def mark_fresh(self, address: str) -> None:
        self._stale.discard(address)
        self._route()

    def after_publication(self, version: int, stale: Sequence[str], log: Callable[[str], None], who: str = "") -> None:
        """Replicas that missed weight version `version` (`stale`) take no traffic until refitted; with none left
        serving it, Unavailable. `who` prefixes the messages (an agent's name in a multi-agent job)."""
        for address in stale:
            self.mark_stale(address)
            log(f"{who}replica {address} missed weight version {version}: stale, no traffic")
        if not self.clients():
            raise Unavailable(
                f"{who}no rollout replica serves weight version {version} (stale: {list(stale)}); "
                "see the replicas' logs in the run folder"
            )

    def expect_version(self, version: int) -> None:
        """From now on a replica that answers with older weights (restarted on its address, or it missed an
        update unnoticed) is marked stale and its rows go elsewhere; the step loop refits it."""
        self.router.min_version = version

    def _found_behind(self, address: str) -> None:
        log.warning(
            "replica %s serves weights older than version %d: stale until refitted", address, self.router.min_version
        )
        with self._lock:
            if address in self._clients:
                self._stale.add(address)
        self._route()

    def _route(self) -> None:
        self.router.set_addresses([a for a in self._clients if a not in self._stale and a not in self.leaving])

    # -- the registry ------------------------------------------------------------------------
    def _on_listing(self, infos: list[ReplicaInfo]) -> None:
        """Watcher thread: newcomers wait for `admit`; drained or vanished members stop getting work."""
        live = {i.address: i for i in infos}
        with self._lock:
            for address, info in live.items():
                if info.state in JOINABLE and address not in self._clients and address not in self.leaving:
                    self.pending.setdefault(address, info)
            for address in list(self.pending):
                if address not in live or live[address].state == DRAINING:
                    self.pending.pop(address)
            for address in self.registered:
                gone = address not in live or live[address].state == DRAINING
                if gone and address not in self.leaving:
                    self.leaving[address] = time.monotonic()
                    log.info("replica %s %s: no new work", address, "drains" if address in live else "is gone")
            self._route()

    def adopt_pending(self, wait_for: int, timeout: float) -> list[str]:
        """At job start: takes the registered replicas as members (the job's first publication refits
        and verifies them all), after waiting up to `timeout` for `wait_for` of them."""
        deadline = time.monotonic() + timeout
        while len(self.pending) < wait_for:
            if time.monotonic() >= deadline:
                raise Unavailable(
                    f"no rollout replica registered within {timeout:.0f}s: start replicas with "
                    "registry.redis_url and registry.namespace matching rollout.registry"
                )
            time.sleep(0.2)
        with self._lock:
            adopted = list(self.pending)
        for address in adopted:
            check_peer(f"rollout replica {address}", self.channel, field=PEER_FIELD, address=address)
        with self._lock:
            for address in adopted:
                self._clients[address] = self._client(address)
                self.registered.add(address)
            self.pending.clear()
            self._route()
        return adopted

    def admit(self, refit: Callable[[RolloutClient], None]) -> list[str]:
        """Refits (to the current version, verified) every pending newcomer, then routes work to it."""
        with self._lock:
            pending = list(self.pending.items())
        joined = []
        for address, info in pending:
            client = self._client(address)
            try:
                check_peer(
                    f"rollout replica {info.replica_id}", self.channel, field=PEER_FIELD, address=address, timeout=10.0
                )
                client.wait_ready(10.0)
                refit(client)  # loads the current version and verifies version and checksums
            except MeshrlError as exc:
                log.warning("replica %s (%s) not admitted yet: %s", info.replica_id, address, exc)
                client.close()
                continue
            with self._lock:
                if self.pending.pop(address, None) is None:
                    client.close()  # it drained or vanished meanwhile
                    continue
                self._clients[address] = client
                self.registered.add(address)
                self._route()
            joined.append(address)
        return joined

    def retire_left(self) -> list[str]:
        """Forgets members that left the routing (drained or dead) once no work of ours runs there."""
        out = []
        busy = {r.address for r in self.router.replicas() if r.outstanding}
        with self._lock:
            for address in [a for a in self.leaving if a not in busy]:
                self.leaving.pop(address)
                self.registered.discard(address)
                self._stale.discard(address)
                client = self._clients.pop(address, None)
                if client is not None:
                    client.close()
                out.append(address)
            self._route()
        return out

    # -- launched members --------------------------------------------------------------------
    def exited(self, address: str) -> None:
        """A replica the job launched died: it gets no more work (its rows in flight go to the others), and when
        it was the last one, work waiting for a replica fails now (the job restarts its services)."""
        with self._lock:
            self._stale.discard(address)
            client = self._clients.pop(address, None)
            self._route()
            if not self._clients and self._watcher is None:
                self.router.none_left(f"the last one, {address}, exited")
        if client is not None:
            client.close()

    def client_for(self, address: str) -> RolloutClient:
        """A client of a replica that may not take traffic yet (e.g. before its first refit)."""
        return self._clients.get(address) or self._client(address)

    def add(self, address: str) -> None:
        self._clients.setdefault(address, self._client(address))
        self._route()

    def remove(self, address: str, drain_timeout: float = 120.0) -> None:
        """Stops routing to the replica and waits for its work in flight to finish."""
        self.router.drain(address, drain_timeout)
        client = self._clients.pop(address, None)
        self._stale.discard(address)
        self._route()
        if client is not None:
            client.close()

    def generate(
        self,
        source: keys_pb2.BatchKey,
        *,
        job_id: str,
        step: int,
        node_id: str,
        n: int,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int | None = None,
        num_prompts: int | None = None,
        columns: Sequence[str] = (),
    ) -> tuple[list[keys_pb2.BatchKey], dict[str, float]]:
        """n samples per prompt of `source` (`num_prompts` rows; `columns` copied into each sample); returns
        the output shard keys (consumers read them all). `seed` makes every sample reproducible (each replica
        derives one per prompt row and sample)."""
        sampling = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed}
        result = self.router.generate_batch(
            source,
            batch_key(job_id, step, node_id),
            sampling,
            n=n,
            job_id=job_id,
            step=step,
            merge=False,
            num_prompts=num_prompts,
            columns=columns,
        )
        seconds = max(result.seconds, 1e-9)
        metrics = {
            "rollout/samples": float(result.samples),
            "rollout/generated_tokens": float(result.generated_tokens),
            "rollout/tokens_per_second": result.generated_tokens / seconds,
            "rollout/seconds": result.seconds,
            "rollout/retries": float(result.retries),
            "rollout/replicas": float(len(result.samples_by_replica)),
            "rollout/min_weight_version": float(result.min_weight_version),
            "rollout/max_weight_version": float(result.max_weight_version),
        }
        return result.keys, metrics

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
        self.router.close()
        for client in self._clients.values():
            client.close()
