"""The job's rollout fleet: the router that spreads a prompt batch over the replicas (each
writes its own output shard), plus per-replica clients for weight updates and status.
Replicas are added (after they load the current weights) and drained before removal.
"""

from __future__ import annotations

from meshrl.api.common.v1 import keys_pb2
from meshrl.common.batch_key import batch_key
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.scheduler.clients import RolloutClient
from meshrl.scheduler.fleet.router import RolloutRouter


class RolloutFleet:
    def __init__(self, buffer: DataBufferClient, addresses: list[str], timeout: float) -> None:
        self.buffer = buffer
        self.timeout = timeout
        self.router = RolloutRouter(addresses=addresses, databuffer=buffer, rpc_timeout_s=timeout)
        self._clients = {a: RolloutClient(a, timeout) for a in addresses}
        self._stale: set[str] = set()  # missed a weight update: no traffic until refitted

    def addresses(self) -> list[str]:
        return list(self._clients)

    def clients(self) -> list[RolloutClient]:
        """Replicas that serve the current weights (stale ones excluded)."""
        return [c for a, c in self._clients.items() if a not in self._stale]

    def stale(self) -> list[RolloutClient]:
        return [self._clients[a] for a in self._stale if a in self._clients]

    def mark_stale(self, address: str) -> None:
        self._stale.add(address)
        self._route()

    def mark_fresh(self, address: str) -> None:
        self._stale.discard(address)
        self._route()

    def _route(self) -> None:
        self.router.set_addresses([a for a in self._clients if a not in self._stale])

    def client_for(self, address: str) -> RolloutClient:
        """A client of a replica that may not take traffic yet (e.g. before its first refit)."""
        return self._clients.get(address) or RolloutClient(address, self.timeout)

    def add(self, address: str) -> None:
        self._clients.setdefault(address, RolloutClient(address, self.timeout))
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
    ) -> tuple[list[keys_pb2.BatchKey], dict[str, float]]:
        """n samples per prompt of `source`; returns the output shard keys (consumers read them all)."""
        sampling = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
        result = self.router.generate_batch(
            source, batch_key(job_id, step, node_id), sampling, n=n, job_id=job_id, step=step, merge=False
        )
        seconds = max(result.seconds, 1e-9)
        metrics = {
            "rollout/samples": float(result.samples),
            "rollout/generated_tokens": float(result.generated_tokens),
            "rollout/tokens_per_second": result.generated_tokens / seconds,
            "rollout/seconds": result.seconds,
            "rollout/retries": float(result.retries),
            "rollout/min_weight_version": float(result.min_weight_version),
            "rollout/max_weight_version": float(result.max_weight_version),
        }
        return result.keys, metrics

    def close(self) -> None:
        self.router.close()
        for client in self._clients.values():
            client.close()
