"""Collective transport: a weight-update group of trainer rank 0 and every replica rank.

The trainer calls `WeightGroup.join(...).send(export, version)`; each replica rank calls
`WeightGroup.join(...).receive(sink)` at the same time. Both sides are told the group by the
scheduler (a CollectiveGroup per member, see group_plan.py). The trainer's rank 0 hosts a
TCPStore at master_address:master_port; the group's backend (gloo or NCCL) is built from it
without touching torch.distributed's default group.

One update: for each bucket the sender posts the bucket's header and WeightBucketMeta in the store
(the first one is the update's announcement, the last one says it is the last) and broadcasts the
bucket's tensors (wire.py); an export whose end it learns only after its last bucket gets an end
marker; an abort marker says its export failed, a failure marker that its broadcast broke.
The collective carries tensor bytes only: a receiver waits for each header in the store (pushed to
it, no polling), so no small broadcast holds the sender up. Each receiver records its progress and
finally confirms or refuses (rendezvous.py).
Every step has a deadline; a failed step leaves the group unusable (destroy it, join a fresh
one), and the sender's error names the members that stopped answering.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import DataLoss, DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable

from .buckets import Bucket, Export, marked_buckets
from .errors import MembersUnresponsive, UpdateOutcome, UpdateRefused
from .group_options import WeightGroupOptions
from .group_plan import GroupSpec
from .plans import ReceivePlans, SendPlans
from .rendezvous import Rendezvous
from .sink import CallbackSink, WeightSink, apply_unless_refused
from .transport import Backend, CollectiveFailed, Deadline, device_for
from .wire import (
    ABORT,
    BUCKET,
    END,
    FAILED,
    LAST,
    BucketLayout,
    decode_header,
    encode_header,
    fit_targets,
    header_bytes,
)


class WeightGroup:
    """One member of a weight-update group. Create with `join`; the sender is rank 0."""

    def __init__(self, spec: GroupSpec, rank: int, device: torch.device, options: WeightGroupOptions) -> None:
        self.spec = spec
        self.rank = rank
        self.device = device
        self.options = options
        self.world_size = spec.world_size
        self.broken = False
        self._seq = 0
        self._rdv: Rendezvous | None = None
        self._backend: Backend | None = None
        self._buffers: dict[int, torch.Tensor] = {}
        self._sent = SendPlans()
        self._received = ReceivePlans()
        self._posted = 0  # headers posted in the current update (the sender's store keys to forget)

    # ---------------------------------------------------------------- joining and leaving
    @classmethod
    def join(
        cls,
        spec: GroupSpec | weights_pb2.CollectiveGroup,
        local_rank: int = 0,
        device: str | torch.device | None = None,
        options: WeightGroupOptions | None = None,
    ) -> WeightGroup:
        """Joins the group as rank `spec.rank_offset + local_rank`, blocking until every member
        joined. Raises MembersUnresponsive (naming the missing ranks) after the init deadline,
        Unavailable when the store cannot be hosted or reached, InvalidArgument for a bad spec."""
        if not isinstance(spec, GroupSpec):
            spec = GroupSpec.from_proto(spec)
        options = options or WeightGroupOptions()
        rank = spec.rank_offset + local_rank
        if not 0 <= rank < spec.world_size:
            raise InvalidArgument(
                f"rank {rank} (offset {spec.rank_offset} + local {local_rank}) >= world {spec.world_size}"
            )
        group = cls(spec, rank, device_for(spec.backend, device), options)
        try:
            group._connect(
                Deadline(options.init_timeout_s or spec.timeout_s, f"joining weight group {spec.group_name!r}")
            )
        except BaseException:
            group.destroy()
            raise
        return group

    def _connect(self, deadline: Deadline) -> None:
        s = self.spec
        self._rdv = Rendezvous(s, self.rank, deadline, self.options.secret)
        self._rdv.join(deadline)
        if not self.is_sender:
            self._rdv.start_heartbeat()
        op_timeout = self.options.op_timeout_s or s.timeout_s
        try:
            self._backend = Backend(
                s.backend,
                self._rdv.backend_store(),
                self.rank,
                s.world_size,
                self.device,
                op_timeout,
                s.master_address,
                self.options.local_address,
                stream=self.options.cpu_wire == "stream",
                connect_timeout_s=max(deadline.remaining(), 1.0),
                secret=self.options.secret,
            )
        except Exception as e:
            raise DeadlineExceeded(f"{deadline.what}: creating the {s.backend} backend failed ({e})") from e

    @property
    def streaming(self) -> bool:
        """Whether tensor bytes travel over the byte stream (stream.py) rather than as gloo broadcasts."""
        return self._backend is not None and self._backend.stream is not None

    @property
    def is_sender(self) -> bool:
        return self.rank == 0

    def destroy(self) -> None:
        """Leaves the group (idempotent). Pending collectives are aborted; peers see them fail."""
        if self._rdv is not None:
            self._rdv.close()
        if self._backend is not None:
            if self.broken:
                self._backend.abort()
            else:
                self._backend.close()
            self._backend = None
        self._rdv = None
        self._buffers.clear()
        self._received.clear()
        self.broken = True

    def __enter__(self) -> WeightGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _require(self, sender: bool) -> None:
        if self._backend is None or self.broken:
            raise FailedPrecondition(
                f"weight group {self.spec.group_name!r} is unusable after a failed step; destroy it and join a fresh one"
            )
        if sender != self.is_sender:
            raise FailedPrecondition(f"rank {self.rank} cannot {'send' if sender else 'receive'}: only rank 0 sends")

    def _fail(self, seq: int = 0, version: int = 0, index: int = 0) -> None:
        """Marks the group unusable and aborts its backend. The sender (given the update it was in) also
        tells the receivers, best effort, so one waiting for the next header fails now, not at its deadline."""
        self.broken = True
        if self._backend is not None:
            self._backend.abort()
        if seq and self.is_sender and self._rdv is not None:
            try:
                failed = weights_pb2.WeightBucketMeta(version=version, bucket_index=index)
                for i in (index, index + 1):  # whichever header the receivers wait for
                    self._post(seq, i, encode_header(FAILED, failed, 0, 0))
            except Exception:  # the store is gone too: receivers fail on it themselves
                pass

    def _buffer(self, slot: int, nbytes: int) -> torch.Tensor:
        buf = self._buffers.get(slot)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            if self.options.keep_buffers:
                self._buffers[slot] = buf
        return buf

    # ---------------------------------------------------------------- sender
    def send(
        self,
        tensors: Export,
        version: int,
        *,
        bucket_bytes: int | None = None,
        layout_name: str | None = None,
    ) -> UpdateOutcome:
        """Broadcasts one complete weight version to every receiver and waits for their confirmation.

        tensors: (HF name, tensor) pairs in export order (consumed lazily, bucketed by
            bucket_bytes) or ready-made buckets. Receivers get them in this order.
        Returns the outcome (every receiver acked). Raises MembersUnresponsive when a receiver
        did not receive or confirm in time (the group is then unusable: destroy it, re-create
        one without `outcome.failed`, and send again to the rest); UpdateRefused when receivers
        answered but refused (the group stays usable); the export's own error after telling the
        receivers to drop the update (the group stays usable).
        """
        self._require(sender=True)
        threshold = self.options.threshold(layout_name or self.options.layout, self.streaming)
        buckets = marked_buckets(tensors, bucket_bytes or self.options.bucket_bytes)
        receivers = range(1, self.world_size)
        if self._seq:
            self._rdv.forget(self._seq, receivers, self._posted)
        self._seq += 1
        self._posted = 0
        seq, op = self._seq, self.options.op_timeout_s or self.spec.timeout_s
        sent, at_boundary, last = 0, True, False  # buckets broadcast so far: the index of the next header
        try:
            for index, (bucket, last) in enumerate(buckets):
                plan = self._sent.get(index, bucket, last, threshold)
                at_boundary = False
                kind = LAST if last else BUCKET
                self._post(seq, index, header_bytes(kind, version, plan.meta_bytes, plan.lay.payload, threshold))
                self._broadcast(bucket, plan.lay, Deadline(op, f"update {version}: bucket {index} data"))
                sent, at_boundary = index + 1, True
            if not last:
                end = weights_pb2.WeightBucketMeta(version=version, bucket_index=sent, num_buckets=sent)
                self._post(seq, sent, encode_header(END, end, 0, 0))
        except CollectiveFailed as e:
            self._fail(seq, version, sent)
            raise self._unresponsive(seq, version, str(e)) from e
        except BaseException as e:
            if not at_boundary:
                self._fail(seq, version, sent)
                raise
            try:
                abort = weights_pb2.WeightBucketMeta(version=version, bucket_index=sent)
                self._post(seq, sent, encode_header(ABORT, abort, 0, 0))
            except Exception as failed:
                self._fail()
                raise self._unresponsive(seq, version, f"{failed} (while aborting after: {e})") from e
            raise
        return self._await_acks(seq, version)

    def _post(self, seq: int, index: int, header: bytes) -> None:
        """Header <index> of update <seq>: the first one announces the update."""
        if index == 0:
            self._rdv.announce(seq, header)
        else:
            self._rdv.post_bucket(seq, index, header)
        self._posted = max(self._posted, index + 1)

    def _broadcast(self, bucket: Bucket, lay: BucketLayout, deadline: Deadline) -> None:
        """The small tensors go first, packed chunk by chunk (each while the one before travels); the
        large ones follow straight from their memory, while the receiver copies the last chunk out."""
        works = []
        for chunk in lay.packed_wire(bucket, lambda n: self._buffer(0, n)):
            works += self._backend.start([chunk], deadline)
        works += self._backend.start(lay.direct_wire(bucket, self.device), deadline)
        self._backend.finish(works, deadline)

    def _await_acks(self, seq: int, version: int) -> UpdateOutcome:
        deadline = Deadline(self.options.ack_timeout_s or self.spec.timeout_s, f"update {version}: confirmations")
        acked, refused, unresponsive = self._rdv.await_acks(seq, range(1, self.world_size), deadline)
        outcome = UpdateOutcome(version, tuple(acked), unresponsive, refused)
        if unresponsive:
            self._fail()
            raise MembersUnresponsive(
                f"update {version}: ranks {list(unresponsive)} did not confirm within {deadline.seconds:.1f}s "
                f"(acked {acked}, refused {refused}); take them out and re-create the group",
                outcome,
            )
        if refused:
            raise UpdateRefused(f"update {version}: refused by {refused}; those replicas are stale", outcome)
        return outcome

    def _unresponsive(self, seq: int, version: int, cause: str) -> MembersUnresponsive:
        suspects, evidence = self._rdv.diagnose(seq, range(1, self.world_size), self.options.grace_s)
        return MembersUnresponsive(
            f"update {version} failed: {cause}; unresponsive ranks {list(suspects)} ({evidence}); "
            "take them out and re-create the group",
            UpdateOutcome(version, unresponsive=suspects),
        )

    # ---------------------------------------------------------------- receiver
    def receive(
        self,
        apply_fn: WeightSink | Callable[[int, list[tuple[str, torch.Tensor]]], None],
        timeout: float | None = None,
    ) -> int:
        """Receives one update into `apply_fn` (a WeightSink such as InPlaceSink, or a function
        called per bucket with (version, [(name, tensor)])) and returns its version.

        timeout: how long to wait for the trainer to start sending (default: the group's timeout);
            every later step has the op deadline. Raises DeadlineExceeded when no update starts in
            time (the group stays usable); the sink's own error when it refused (reported to the
            sender; the group stays usable); Aborted when the trainer dropped the update;
            DeadlineExceeded / Unavailable when the transfer failed (the group is then unusable).
        """
        self._require(sender=False)
        sink = apply_fn if isinstance(apply_fn, WeightSink) else CallbackSink(apply_fn)
        seq = self._seq + 1
        start = Deadline(timeout or self.spec.timeout_s, f"rank {self.rank}: waiting for update {seq} to start")
        first = self._rdv.await_announcement(seq, start)
        if first is None:
            raise DeadlineExceeded(f"{start.what}: the trainer sent nothing within {start.seconds:.1f}s")
        self._seq = seq
        version = decode_header(first)[1]
        refusal: Exception | None = None
        try:
            sink.begin(version)
        except Exception as e:
            refusal = e
        try:
            self._receive_buckets(seq, version, sink, refusal, first)
        except _Refused as r:
            refusal = r.error
        except CollectiveFailed as e:
            self._fail()
            self._rdv.report_failure(seq, str(e))
            cls = DeadlineExceeded if e.timed_out else Unavailable
            raise cls(
                f"rank {self.rank}: update {version} failed ({e}); this replica may hold part of it: "
                "mark it stale, destroy this group and refit it"
            ) from e
        if refusal is None:
            try:
                sink.end(version)
            except Exception as e:
                refusal = e
        self._rdv.ack(seq, refusal)
        if refusal is not None:
            raise refusal
        return version

    def _receive_buckets(
        self, seq: int, version: int, sink: WeightSink, refusal: Exception | None, first: bytes
    ) -> None:
        op = self.options.op_timeout_s or self.spec.timeout_s
        index = 0
        while True:
            what = f"update {version}: bucket {index}"
            header = first if index == 0 else self._rdv.await_bucket(seq, index, Deadline(op, f"{what} header"))
            kind, meta, lay = self._header(header, version, index, what)
            if kind != END:
                refusal = self._receive_bucket(meta, lay, sink, refusal, Deadline(op, f"{what} data"))
                self._rdv.progress(seq, index)
            if kind in (END, LAST):
                if refusal is not None:
                    raise _Refused(refusal)
                return
            index += 1

    def _header(
        self, header: bytes, version: int, index: int, what: str
    ) -> tuple[int, weights_pb2.WeightBucketMeta, BucketLayout | None]:
        """Bucket <index>'s header checked against the stream (ReceivePlans.checked); a stream that cannot be
        trusted (DataLoss) leaves the group unusable."""
        try:
            return self._received.checked(header, version, index, what)
        except DataLoss:
            self._fail()
            raise

    def _receive_bucket(
        self,
        meta: weights_pb2.WeightBucketMeta,
        lay: BucketLayout,
        sink: WeightSink,
        refusal: Exception | None,
        deadline: Deadline,
    ) -> Exception | None:
        """Receives one bucket into the sink (or, once refused, into staging only, to stay in step
        with the others); returns the refusal, if any."""
        targets = None
        if refusal is None and lay.direct:
            try:
                targets = fit_targets(sink.targets(meta), lay, self.device)
            except Exception as e:
                refusal = e
        staging = self._buffer(1, lay.staging_bytes(targets is not None))
        if self.options.keep_buffers:  # the same views as last time when nothing changed
            wire, tensors = self._received.views(meta.bucket_index, lay, staging, targets)
        else:
            wire, tensors = lay.receiver_wire(staging, targets)
        works = self._backend.start(wire, deadline)
        for k, (first, end, _, _) in enumerate(lay.chunks):  # copied out while the next ones arrive
            self._backend.finish(works[k : k + 1], deadline)
            refusal = apply_unless_refused(sink, meta, [tensors[i] for i in lay.packed[first:end]], refusal)
        self._backend.finish(works[len(lay.chunks) :], deadline)
        rest = lay.direct if lay.chunks else lay.packed + lay.direct  # packed without bytes: no chunk
        if rest:
            refusal = apply_unless_refused(sink, meta, [tensors[i] for i in rest], refusal)
        return refusal


class _Refused(Exception):
    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error
