"""Membership of a weight-update process group: rank offsets per replica, and re-planning.

The scheduler builds a `GroupPlan` from the replicas' rank counts (a replica with tensor
parallelism 2 holds 2 ranks), sends each member its CollectiveGroup, and after a failed update
asks `replicas_of` which replicas to take out and `without` for the fresh group of the rest.
Rank 0 is always the trainer (the sender, which also hosts the group's TCPStore).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from meshrl.api.common.v1 import weights_pb2
from meshrl.common import weight_group_codes as codes
from meshrl.common.errors import InvalidArgument
from meshrl.common.weight_group_codes import backend_name, protocol_name

BACKENDS = tuple(codes.BACKENDS)  # ("gloo", "nccl")
PROTOCOLS = tuple(codes.PROTOCOLS)  # ("meshrl", "engine"): see GroupProtocol and engine_group.py


@dataclass(frozen=True)
class GroupSpec:
    """What one member needs to join (the CollectiveGroup message as a checked domain type).

    rank_offset: the member's first rank (trainer 0; a replica's TP rank r joins as offset + r).
    timeout_s: the deadline of each step (join, each bucket's metadata and data, confirmation).
    """

    master_address: str
    master_port: int
    world_size: int
    rank_offset: int
    group_name: str = "meshrl-weights"
    backend: str = "gloo"
    timeout_s: float = 60.0
    protocol: str = "meshrl"
    sealed: bool = False  # protocol "engine": every engine rank seals the backend's store (meshrl's vLLM worker)

    def __post_init__(self) -> None:
        if not self.master_address:
            raise InvalidArgument("CollectiveGroup.master_address is empty; set it to the trainer rank 0's address")
        if not 0 < self.master_port < 65536:
            raise InvalidArgument(f"CollectiveGroup.master_port {self.master_port} is not a TCP port")
        if self.world_size < 2:
            raise InvalidArgument(f"CollectiveGroup.world_size {self.world_size} < 2: the trainer needs a receiver")
        if not 0 <= self.rank_offset < self.world_size:
            raise InvalidArgument(f"CollectiveGroup.rank_offset {self.rank_offset} is outside [0, {self.world_size})")
        if self.backend not in BACKENDS:
            raise InvalidArgument(f"CollectiveGroup.backend {self.backend!r} is not one of {BACKENDS}")
        if self.protocol not in PROTOCOLS:
            raise InvalidArgument(f"CollectiveGroup.protocol {self.protocol!r} is not one of {PROTOCOLS}")
        if not self.group_name:
            raise InvalidArgument("CollectiveGroup.group_name is empty; name the group (a fresh name per re-creation)")
        if self.sealed and self.protocol != "engine":
            raise InvalidArgument(
                "CollectiveGroup.sealed applies to protocol engine; the meshrl protocol seals its store whenever "
                "the services hold a token"
            )
        if not self.timeout_s > 0:
            raise InvalidArgument(f"CollectiveGroup.timeout_seconds {self.timeout_s} must be > 0")

    @classmethod
    def from_proto(cls, msg: weights_pb2.CollectiveGroup) -> GroupSpec:
        return cls(
            master_address=msg.master_address,
            master_port=msg.master_port,
            world_size=msg.world_size,
            rank_offset=msg.rank_offset,
            group_name=msg.group_name or "meshrl-weights",
            backend=backend_name(msg.backend),
            timeout_s=msg.timeout_seconds or 60.0,
            protocol=protocol_name(msg.protocol),
            sealed=msg.sealed,
        )

    def to_proto(self) -> weights_pb2.CollectiveGroup:
        return weights_pb2.CollectiveGroup(
            master_address=self.master_address,
            master_port=self.master_port,
            world_size=self.world_size,
            rank_offset=self.rank_offset,
            group_name=self.group_name,
            backend=codes.BACKENDS[self.backend],
            timeout_seconds=self.timeout_s,
            protocol=codes.PROTOCOLS[self.protocol],
            sealed=self.sealed,
        )


@dataclass(frozen=True)
class GroupPlan:
    """The trainer (rank 0) and replicas in order; replica i holds ranks offsets[i] .. + ranks[i] - 1."""

    sender: GroupSpec
    replica_ids: tuple[str, ...]
    replica_ranks: tuple[int, ...]

    @staticmethod
    def build(
        replicas: Sequence[tuple[str, int]],
        master_address: str,
        master_port: int,
        group_name: str = "meshrl-weights",
        backend: str = "gloo",
        timeout_s: float = 60.0,
    ) -> GroupPlan:
        """replicas: (replica id, number of ranks it joins with) in rank order."""
        if not replicas:
            raise InvalidArgument("a weight-update group needs at least one replica")
        ids = tuple(r for r, _ in replicas)
        if len(set(ids)) != len(ids):
            raise InvalidArgument(f"replica ids must be unique, got {list(ids)}")
        counts = tuple(n for _, n in replicas)
        if any(n < 1 for n in counts):
            raise InvalidArgument(f"every replica joins with at least one rank, got {list(counts)}")
        sender = GroupSpec(master_address, master_port, 1 + sum(counts), 0, group_name, backend, timeout_s)
        return GroupPlan(sender, ids, counts)

    @property
    def offsets(self) -> list[int]:
        out, next_rank = [], 1
        for n in self.replica_ranks:
            out.append(next_rank)
            next_rank += n
        return out

    def replica_spec(self, replica_id: str) -> GroupSpec:
        i = self._index(replica_id)
        return replace(self.sender, rank_offset=self.offsets[i])

    def replicas_of(self, ranks: Iterable[int]) -> list[str]:
        """The replicas holding any of these ranks (rank 0, the trainer, maps to none)."""
        offsets = self.offsets
        hit = {bisect.bisect_right(offsets, r) - 1 for r in ranks if 0 < r < self.sender.world_size}
        return [self.replica_ids[i] for i in sorted(hit)]

    def without(self, replica_ids: Iterable[str], master_port: int, group_name: str) -> GroupPlan:
        """A fresh plan of the remaining replicas (new port and name: the old group may linger)."""
        drop = set(replica_ids)
        for r in drop:
            self._index(r)
        kept = [(r, n) for r, n in zip(self.replica_ids, self.replica_ranks, strict=True) if r not in drop]
        s = self.sender
        return GroupPlan.build(kept, s.master_address, master_port, group_name, s.backend, s.timeout_s)

    def _index(self, replica_id: str) -> int:
        try:
            return self.replica_ids.index(replica_id)
        except ValueError:
            raise InvalidArgument(f"replica {replica_id!r} is not in group {self.sender.group_name!r}") from None
