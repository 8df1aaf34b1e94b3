"""The process-group backend of one weight group: gloo (CPU) or NCCL (GPU), one code path.

Built straight from a store (a PrefixStore over the trainer's TCPStore) as a standalone
ProcessGroupGloo / ProcessGroupNCCL, so it never touches torch.distributed's default group
that a service may already use for data parallelism. Every wait has a deadline; a failed or
late collective leaves the backend unusable and it is aborted. Used by `collective.py`.
On gloo the tensor bytes travel over the group's byte stream (stream.py) when every member offers it;
the gloo group is made either way (it is how an older member joins), and carries them otherwise.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from meshrl.common.errors import InvalidArgument, Unavailable

from .stream import StreamOffer, WeightStream

log = logging.getLogger(__name__)

GLOO_THREADS = 4  # measured on 2 cores: 52 in-flight broadcasts of 188 MiB beat one flat broadcast


class Deadline:
    """A point in time a step must finish by; `what` names the step in error messages."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds = seconds
        self.what = what
        self.end = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.end


class CollectiveFailed(Exception):
    """A collective did not complete: `timed_out` when its deadline passed, else a peer failed."""

    def __init__(self, message: str, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


class Backend:
    """One standalone c10d backend; broadcast() is the only collective the weight plane needs."""

    def __init__(
        self,
        backend: str,
        store: dist.Store,
        rank: int,
        world_size: int,
        device: torch.device,
        op_timeout_s: float,
        master_address: str,
        local_address: str | None,
        stream: bool = False,
        connect_timeout_s: float | None = None,
        secret: str | None = None,
    ) -> None:
        """stream: offer the byte stream (stream.py) on gloo; the group uses it when every member offers it.
        secret: the service token the stream's members prove (set: the stream is required)."""
        self.name = backend
        self.device = device
        self.stream: WeightStream | None = None
        timeout = timedelta(seconds=op_timeout_s)
        if backend == "gloo":
            offer = StreamOffer(store, rank, world_size, master_address, local_address, secret) if stream else None
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._threads = GLOO_THREADS  # several tensors in flight at once: a bucket's broadcasts overlap
            if local_address is None and _is_loopback(master_address):
                local_address = "127.0.0.1"  # every member is on this host: bind loopback
            if local_address is not None:
                opts._devices = [dist.ProcessGroupGloo.create_device(hostname=local_address)]
            else:  # honours GLOO_SOCKET_IFNAME, else the host name's address
                opts._devices = [dist.ProcessGroupGloo.create_default_device()]
            self.pg = dist.ProcessGroupGloo(store, rank, world_size, opts)
            if offer is not None:  # every member posted its offer before it made the gloo group
                self.stream = offer.connect(connect_timeout_s or op_timeout_s)
        else:
            if secret:
                log.warning(
                    "weight group on NCCL: its members proved the service token and NCCL's unique id is sealed "
                    "in the store, but NCCL carries the weights unencrypted; keep the group's network private "
                    "(docs/security.md)"
                )
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
            self.pg.eager_connect_single_device(device)  # create the communicator now, within the join deadline

    def broadcast(self, tensors: list[torch.Tensor], deadline: Deadline) -> None:
        """Broadcasts each tensor from rank 0 (root sends, others receive in place), all within `deadline`."""
        self.finish(self.start(tensors, deadline), deadline)

    def start(self, tensors: list[torch.Tensor], deadline: Deadline) -> list:
        """Starts one broadcast per tensor and returns their works (for `finish`), so the caller can
        prepare the next tensors while these travel."""
        if self.pg is None:
            raise CollectiveFailed(f"{deadline.what}: the group's backend was aborted after an earlier failure", False)
        if self.stream is not None:  # bytes in order over the stream: no operation to pair up
            return self.stream.start(tensors)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        try:
            return [self.pg.broadcast([t], opts) for t in tensors]
        except Exception as e:
            raise _failed(e, deadline) from e

    def finish(self, works: list, deadline: Deadline) -> None:
        """Waits for started broadcasts, all within `deadline`; raises CollectiveFailed."""
        try:
            for work in works:
                left = deadline.remaining()
                if left <= 0 and not work.is_completed():
                    raise CollectiveFailed(f"{deadline.what}: not done within {deadline.seconds:.1f}s", True)
                work.wait(timedelta(seconds=max(left, 0.001)))
        except CollectiveFailed:
            raise
        except Exception as e:
            raise _failed(e, deadline) from e

    def close(self) -> None:
        """Releases an idle backend now (its worker threads exit at once)."""
        self.pg = None
        self._close_stream()

    def _close_stream(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()

    def abort(self) -> None:
        """Aborts pending collectives and drops the backend on a background thread.

        Destroying a gloo group waits for its worker threads, which can sit in a stuck operation
        until the backend's own timeout; the caller must not wait for that.
        """
        self._close_stream()  # a thread blocked in a send or a receive fails at once
        pg, self.pg = self.pg, None
        if pg is None:
            return
        for method in ("abort", "shutdown"):
            try:
                getattr(pg, method)()
                break
            except Exception as e:  # not supported by this backend or torch version: try the next
                log.debug("weight group backend %s() failed: %s", method, e)
        holder = [pg]
        del pg
        threading.Thread(target=holder.clear, name="weights-backend-release", daemon=True).start()


def _failed(e: Exception, deadline: Deadline) -> CollectiveFailed:
    """torch's RuntimeError / DistBackendError with gloo's or NCCL's message, as a CollectiveFailed."""
    text = str(e)
    timed_out = deadline.expired() or "timed out" in text.lower() or "timeout" in text.lower()
    return CollectiveFailed(f"{deadline.what}: {text.splitlines()[0] if text else type(e).__name__}", timed_out)


def device_for(backend: str, device: str | torch.device | None) -> torch.device:
    """The device a member's broadcast tensors live on: CPU for gloo, a CUDA device for NCCL."""
    if backend == "gloo":
        d = torch.device(device or "cpu")
        if d.type != "cpu":
            raise InvalidArgument(f"the gloo weight group works on CPU tensors, got device {d}; use backend 'nccl'")
        return d
    if not torch.cuda.is_available():
        raise InvalidArgument("backend 'nccl' needs a CUDA device and none is visible; use backend 'gloo' on CPU")
    d = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if d.type != "cuda":
        raise InvalidArgument(f"backend 'nccl' needs a CUDA device, got {d}")
    return d


def await_keys(store: dist.Store, keys: list[str], deadline: Deadline) -> list[str]:
    """Waits until every key exists or the deadline passes; returns the keys still missing.

    The store pushes the answer as soon as the keys are set (no polling latency); on a timeout
    the missing keys are looked up one by one. Raises Unavailable when the store is gone.
    """
    try:
        store.wait(keys, timedelta(seconds=max(deadline.remaining(), 0.001)))
        return []
    except Exception as waited:  # DistStoreError on timeout; a network error when the trainer is gone
        try:
            return [k for k in keys if not store.check([k])]
        except Exception as e:
            raise Unavailable(f"{deadline.what}: the weight group's store is unreachable ({e})") from waited


def await_values(store: dist.Store, keys: list[str], deadline: Deadline) -> list[bytes | None]:
    """The value of each key once all exist, in one round trip (the store waits for them and answers
    as soon as the last is set); the keys still missing at the deadline come back as None.
    Raises Unavailable when the store is gone."""
    before = store.timeout
    try:
        store.set_timeout(timedelta(seconds=max(deadline.remaining(), 0.001)))
        return list(store.multi_get(keys))
    except Exception as waited:  # DistStoreError on timeout; a network error when the trainer is gone
        try:
            present = [k for k in keys if store.check([k])]
            got = dict(zip(present, store.multi_get(present), strict=True)) if present else {}
        except Exception as e:
            raise Unavailable(f"{deadline.what}: the weight group's store is unreachable ({e})") from waited
        return [got.get(k) for k in keys]
    finally:
        store.set_timeout(before)
