"""The options of one member of a weight-update group (meshrl.common.weights.collective): bucket size,
layout, coalescing threshold, deadlines, grace period, bind address, buffer reuse, the CPU wire; checked
when made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshrl.common.errors import InvalidArgument
from meshrl.common.weight_group_secret import group_secret

from .buckets import DEFAULT_BUCKET_BYTES
from .wire import DEFAULT_COALESCE_BYTES, FLAT_THRESHOLD

LAYOUTS = ("flat", "per_tensor")
CPU_WIRES = ("stream", "gloo")


@dataclass(frozen=True)
class WeightGroupOptions:
    """bucket_bytes: bucket size of `send` (512 MiB default, as slime).
    layout: "per_tensor" broadcasts each tensor of at least `coalesce_bytes` straight from the
        sender's memory into the receiver's parameter (no copies) and the smaller ones packed in
        one buffer per bucket; "flat" packs the whole bucket into one buffer (one broadcast per
        bucket, two copies). Receivers follow whatever layout the sender uses.
    init_timeout_s / op_timeout_s / ack_timeout_s: deadlines of joining, of each bucket's
        metadata and data, and of the receivers' confirmation; None = the group's timeout_s.
    grace_s: after a failed step, how long the sender watches heartbeats to name the culprits.
    local_address: address this member's gloo transport binds (None: loopback when the master
        is loopback, else GLOO_SOCKET_IFNAME or the host name's address).
    cpu_wire: how a gloo group moves tensor bytes: "stream" (one TCP connection from the sender to
        each receiver, tensors read straight into their targets, no per-tensor operation; used when
        every member offers it, stream.py) or "gloo" (one gloo broadcast per tensor or packed chunk).
    stream_coalesce_bytes: the per_tensor threshold on the stream (0: every tensor straight from the
        sender's memory into the receiver's parameter; nothing is packed, nothing copied).
    keep_buffers: keep the packing/staging buffers between updates (first use of fresh memory
        is slow; a long-lived group should keep them).
    secret: the service token members prove to each other (default: this process's, set from
        server.auth by run_service). Set, a gloo group must stream (no gloo fallback), the stream binds
        only its address, and the store's headers and acknowledgements are signed (stream.py, rendezvous.py).
    """

    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    layout: str = "per_tensor"
    coalesce_bytes: int = DEFAULT_COALESCE_BYTES
    init_timeout_s: float | None = None
    op_timeout_s: float | None = None
    ack_timeout_s: float | None = None
    grace_s: float = 1.5
    local_address: str | None = None
    keep_buffers: bool = True
    cpu_wire: str = "stream"
    stream_coalesce_bytes: int = 0
    secret: str | None = field(default_factory=group_secret, repr=False)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise InvalidArgument(f"weight group layout {self.layout!r} is not one of {sorted(LAYOUTS)}")
        if self.bucket_bytes <= 0:
            raise InvalidArgument(f"bucket_bytes must be positive, got {self.bucket_bytes}")
        for name in ("coalesce_bytes", "stream_coalesce_bytes"):
            if getattr(self, name) < 0:
                raise InvalidArgument(
                    f"{name} must be >= 0 (0 sends every tensor on its own), got {getattr(self, name)}"
                )
        if self.cpu_wire not in CPU_WIRES:
            raise InvalidArgument(f"cpu_wire {self.cpu_wire!r} is not one of {list(CPU_WIRES)}")
        if self.secret and self.cpu_wire != "stream":
            raise InvalidArgument(
                "cpu_wire 'gloo' carries weights unauthenticated, and this process has a service token (the weight "
                "group is secured): use cpu_wire 'stream', whose members prove the token"
            )
        for name in ("init_timeout_s", "op_timeout_s", "ack_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise InvalidArgument(f"{name} must be > 0 seconds (or None for the group's timeout), got {value}")

    def threshold(self, layout_name: str, streaming: bool = False) -> int:
        """The coalescing threshold a layout sends with: "flat" packs everything."""
        if layout_name not in LAYOUTS:
            raise InvalidArgument(f"weight group layout {layout_name!r} is not one of {sorted(LAYOUTS)}")
        if layout_name == "flat":
            return FLAT_THRESHOLD
        return self.stream_coalesce_bytes if streaming else self.coalesce_bytes
