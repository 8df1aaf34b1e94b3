"""Weight groups in the engines' own wire (CollectiveGroup.protocol "engine"): what SGLang's
`init_weights_update_group` / `update_weights_from_distributed` and meshrl's vLLM worker extension
expect. The engine servers' workers join the group themselves (rank = rank_offset + their TP rank);
the replica's adapter only reads each bucket's names/dtypes/shapes from the rendezvous store and
tells its engine to receive them; the trainer broadcasts each tensor, in list order, from rank 0.

`engine_process_group` builds the group the way those engines do (tcp rendezvous hosted by rank 0,
store prefixed by the group name, torch's backend per device), so both ends meet. `EngineGroupSender`
(trainer rank 0, `join`/`send`/`destroy` like WeightGroup) and `EngineGroupReader` (the adapters)
share the store keys below. Used by the trainer service and the SGLang / vLLM adapters.

With a service token (the process's `group_secret`, the same on trainer and replicas) the bucket specs and
the adapters' confirmations carry an HMAC of it: a stranger who reaches the store cannot make an adapter
receive tensors of its choosing nor the trainer count a forged confirmation. A sealed group (`GroupSpec.sealed`:
every engine rank is meshrl's vLLM worker, which builds its backend with `sealed_for` too) also seals what the
backend keeps in the store, so a stranger can neither read NCCL's id or gloo's addresses nor pose as a rank.
SGLang's workers build their backend themselves and join unauthenticated: docs/security.md says what stays open.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import DataLoss, DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable
from meshrl.common.weight_group_secret import SECRET_ENV, group_secret, mac

from . import dtypes
from .buckets import DEFAULT_BUCKET_BYTES, Export, as_buckets, bucket_specs
from .errors import MembersUnresponsive, UpdateOutcome, UpdateRefused
from .group_plan import GroupSpec
from .sealed_store import SealedStore
from .store_host import host_store
from .transport import Deadline

POLL_S = 0.02


def _key(group: str, seq: int, what: str) -> str:
    return f"meshrl-engine/{group}/{seq}/{what}"


def _signed(key: str, value: bytes, secret: str | None) -> bytes:
    """`value` with the service token's HMAC over its key appended (nothing to append without a token)."""
    return value + mac(secret, key, value) if secret else value


def _verified(key: str, value: bytes, secret: str | None) -> bytes:
    """What the trainer or an adapter signed; DataLoss when the value does not carry the token's HMAC."""
    if not secret:
        return value
    body, tag = value[:-32], value[-32:]
    if len(value) < 32 or not hmac.compare_digest(tag, mac(secret, key, body)):
        raise DataLoss(
            f"{key} in the weight group's store is not signed with the service token: someone other than the "
            "trainer or a replica wrote the group's store (or they hold different server.auth tokens)"
        )
    return body


def _confirmations(text: str, seq_key: str, secret: str | None) -> dict[int, tuple[int, str]]:
    """The adapters' signed confirmation lines of one update: rank offset -> (ranks, "ok" or the refusal);
    unsigned or malformed lines are ignored, the first line of an offset counts."""
    found: dict[int, tuple[int, str]] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 4 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        try:
            status = bytes.fromhex(parts[2]).decode(errors="replace")
            tag = bytes.fromhex(parts[3])
        except ValueError:
            continue
        offset, ranks = int(parts[0]), int(parts[1])
        if secret and not hmac.compare_digest(tag, mac(secret, seq_key, offset, ranks, status)):
            continue
        found.setdefault(offset, (ranks, status))
    return found


def first_device(backend: str) -> str:
    """The device torch's group helper builds the backend under: the first of the backend's map (gloo:
    "cpu", nccl: "cuda"); when every device maps to the same backend it builds that one only."""
    return next(iter(dist.distributed_c10d.BackendConfig(dist.Backend(backend)).get_device_backend_map()))


def engine_process_group(
    backend: str, store: dist.Store, rank: int, world_size: int, group_name: str, timeout_s: float
):
    """The c10d backend of an engine worker's weight group, built over `store` (the rendezvous TCPStore)
    with the prefixes torch's group helper uses under the engines' group-name prefix. Standalone: it
    registers no torch.distributed group, so any number coexist in one process."""
    prefixed = dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, store))
    per_device = dist.PrefixStore(f"{first_device(backend)}/", prefixed)
    timeout = timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(per_device, rank, world_size, timeout)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout  # no eager connect: the engines create the communicator on the first broadcast
    return dist.ProcessGroupNCCL(per_device, rank, world_size, opts)


def sealed_for(store: dist.Store, secret: str | None, group_name: str, sealed: bool) -> dist.Store:
    """The store an engine group's backend is built over: sealed with the service token (sealed_store.py) when
    the group is (GroupSpec.sealed: every engine rank is meshrl's vLLM worker), else the store itself. A sealed
    group without a token is refused: its ranks could not agree."""
    if not sealed:
        return store
    if not secret:
        raise FailedPrecondition(
            f"weight group {group_name!r} is sealed but this process holds no service token; give the trainer "
            f"and every replica the same server.auth token (a vLLM server you start yourself: set {SECRET_ENV})"
        )
    return SealedStore(store, secret, group_name)


def broadcast_all(pg, tensors: list[torch.Tensor], deadline: Deadline) -> None:
    """One broadcast per tensor from rank 0, as the engines' receivers call them, within `deadline`."""
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    try:
        works = [pg.broadcast([t], opts) for t in tensors]
        for work in works:
            work.wait(timedelta(seconds=max(deadline.remaining(), 0.001)))
    except Exception as e:  # gloo's / NCCL's error
        raise DeadlineExceeded(f"{deadline.what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


def dtype_name(spec_dtype: int) -> str:
    """ "bfloat16", "float32", ... as SGLang's and vLLM's requests name them."""
    return str(dtypes.from_proto(spec_dtype)).removeprefix("torch.")


class EngineGroupSender:
    """Trainer rank 0 of an "engine" protocol group: hosts the store, broadcasts every bucket."""

    def __init__(self, spec: GroupSpec, device: torch.device) -> None:
        self.spec = spec
        self.device = device
        self.world_size = spec.world_size
        self.broken = False
        self._seq = 0
        self.secret = group_secret()
        # on the group's address only (strictly so when this process has a service token); the engines'
        # workers join unauthenticated: docs/security.md says what stays open
        self.store = host_store(
            spec.master_address,
            spec.master_port,
            spec.world_size,
            spec.timeout_s,
            strict=bool(self.secret),
            multi_tenant=True,
        )
        store = sealed_for(self.store, self.secret, spec.group_name, spec.sealed)
        self.pg = engine_process_group(spec.backend, store, 0, spec.world_size, spec.group_name, spec.timeout_s)

    @classmethod
    def join(cls, spec: GroupSpec | weights_pb2.CollectiveGroup) -> EngineGroupSender:
        if not isinstance(spec, GroupSpec):
            spec = GroupSpec.from_proto(spec)
        if spec.rank_offset != 0:
            raise InvalidArgument(f"the trainer is rank 0 of weight group {spec.group_name!r}, not {spec.rank_offset}")
        if spec.backend == "nccl":
            if not torch.cuda.is_available():
                raise InvalidArgument("backend 'nccl' needs a CUDA device and none is visible; use 'gloo' on CPU")
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
        try:
            return cls(spec, device)
        except Exception as e:  # the store's port taken, or members missing past the deadline (gloo)
            raise Unavailable(f"joining engine weight group {spec.group_name!r} failed: {e}") from e

    def send(self, tensors: Export, version: int, *, bucket_bytes: int | None = None, **_layout: Any) -> UpdateOutcome:
        """Per bucket: its specs on the store, then one broadcast per tensor; then waits until every
        engine rank confirmed through its adapter (UpdateRefused / MembersUnresponsive otherwise).
        The group sender's `layout_name` is accepted and has no use here: engines receive each tensor alone."""
        if self.broken:
            raise FailedPrecondition(f"weight group {self.spec.group_name!r} is unusable after a failed step")
        self._seq += 1
        seq, g, op = self._seq, self.spec.group_name, self.spec.timeout_s
        count = 0
        try:
            for index, bucket in enumerate(as_buckets(tensors, bucket_bytes or DEFAULT_BUCKET_BYTES)):
                meta = weights_pb2.WeightBucketMeta(version=version, bucket_index=index, tensors=bucket_specs(bucket))
                key = _key(g, seq, f"bucket/{index}")
                self.store.set(key, _signed(key, meta.SerializeToString(), self.secret))
                wire = [t.detach().to(self.device).contiguous() for _, t in bucket]
                broadcast_all(self.pg, wire, Deadline(op, f"update {version}: bucket {index}"))
                count = index + 1
        except DeadlineExceeded as e:
            self.broken = True
            raise MembersUnresponsive(f"update {version}: {e}", UpdateOutcome(version)) from e
        end = weights_pb2.WeightBucketMeta(version=version, bucket_index=count, num_buckets=count)
        self.store.set(_key(g, seq, "end"), _signed(_key(g, seq, "end"), end.SerializeToString(), self.secret))
        return self._await_acks(seq, version)

    def _await_acks(self, seq: int, version: int) -> UpdateOutcome:
        deadline = Deadline(self.spec.timeout_s, f"update {version}: confirmations")
        receivers = self.world_size - 1
        key = _key(self.spec.group_name, seq, "confirmations")
        while True:
            text = self.store.get(key).decode(errors="replace") if self.store.check([key]) else ""
            found = _confirmations(text, key, self.secret)
            confirmed = sum(ranks for ranks, _ in found.values())
            if confirmed >= receivers:
                break
            if deadline.expired():
                self.broken = True
                raise MembersUnresponsive(
                    f"{deadline.what}: {confirmed} of {receivers} engine ranks confirmed within "
                    f"{deadline.seconds:.1f}s; re-create the group without the silent replicas",
                    UpdateOutcome(version),
                )
            time.sleep(POLL_S)
        refused = {offset: status for offset, (_, status) in found.items() if status != "ok"}
        if refused:
            outcome = UpdateOutcome(version, refused=refused)
            lines = "; ".join(f"{offset}: {why}" for offset, why in sorted(refused.items()))
            raise UpdateRefused(f"update {version}: refused by engine ranks {sorted(refused)}: {lines}", outcome)
        return UpdateOutcome(version, acked=tuple(range(1, self.world_size)))

    def destroy(self) -> None:
        pg, self.pg = self.pg, None
        if pg is not None and self.broken:
            for method in ("abort", "shutdown"):
                try:
                    getattr(pg, method)()
                    break
                except Exception:  # noqa: BLE001 - not offered by this backend / torch version
                    continue
        self.broken = True


class EngineGroupReader:
    """A replica adapter's view of an "engine" group: the bucket specs of each update, and its confirmation."""

    def __init__(self, spec: GroupSpec, ranks: int) -> None:
        self.spec = spec
        self.ranks = ranks
        self._seq = 0
        self.secret = group_secret()
        try:
            self.store = dist.TCPStore(
                spec.master_address, spec.master_port, spec.world_size, False, timedelta(seconds=spec.timeout_s)
            )
        except Exception as e:
            raise Unavailable(f"the trainer's weight store at {spec.master_address}:{spec.master_port}: {e}") from e

    def buckets(self, version: int, timeout_s: float) -> Iterator[weights_pb2.WeightBucketMeta]:
        """The next update's bucket specs, in order (each once the trainer announced it)."""
        self._seq += 1
        g, seq = self.spec.group_name, self._seq
        index = 0
        deadline = Deadline(timeout_s, f"replica rank {self.spec.rank_offset}: update {version}")
        while True:
            bucket, end = _key(g, seq, f"bucket/{index}"), _key(g, seq, "end")
            while True:
                if self.store.check([bucket]):
                    signed = _verified(bucket, self.store.get(bucket), self.secret)
                    meta = weights_pb2.WeightBucketMeta.FromString(signed)
                    break
                if self.store.check([end]):
                    _verified(end, self.store.get(end), self.secret)
                    return
                if deadline.expired():
                    raise DeadlineExceeded(f"{deadline.what}: bucket {index} was not announced in time")
                time.sleep(POLL_S)
            if meta.version != version:
                raise InvalidArgument(f"the trainer sends weight version {meta.version}, but {version} was announced")
            yield meta
            index += 1

    def confirm(self, error: Exception | None = None) -> None:
        """Counts this replica's ranks as done (with its refusal, if any) for the current update."""
        key = _key(self.spec.group_name, self._seq, "confirmations")
        offset, status = self.spec.rank_offset, "ok" if error is None else f"{type(error).__name__}: {error}"[:2000]
        tag = mac(self.secret, key, offset, self.ranks, status).hex() if self.secret else ""
        self.store.append(key, f"{offset}|{self.ranks}|{status.encode().hex()}|{tag}\n")


def join_sender(spec: GroupSpec | weights_pb2.CollectiveGroup, **kwargs):
    """The trainer's member of a weight group of either protocol (WeightGroup or EngineGroupSender)."""
    from .collective import WeightGroup

    if not isinstance(spec, GroupSpec):
        spec = GroupSpec.from_proto(spec)
    if spec.protocol == "engine":
        return EngineGroupSender.join(spec)
    return WeightGroup.join(spec, **kwargs)
