"""Trainer ranks (TP x PP x DP): joining their world (rank 0 hosts the rendezvous store), and the command bus rank 0 uses to drive the others.

Rank 0 serves gRPC; every collective operation (load, log-probs, values, train, checkpoints) is first
broadcast to ranks 1..N-1 as a JSON command over a gloo group, then run on every rank in the same
order. Commands carry data-buffer keys and settings only: each rank reads the batch itself.
Used by `meshrl.trainer.__main__` (rank 0), `meshrl.trainer.worker` (other ranks) and `service`.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from meshrl.common.batch_key import BatchRef
from meshrl.common.comm_backend import resolve_backend
from meshrl.common.errors import ConfigError, Unavailable

log = logging.getLogger(__name__)
STOP = "__stop__"


def rank_zero_store(address: str, port: int, world: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's rendezvous store, listening on address:port before any other rank is told the port: with
    port 0 it binds a free one itself (read `.port`), so no other process can take the port between choosing
    and binding it. Raises ConfigError when a configured port is taken."""
    try:
        return dist.TCPStore(
            address, port, world, is_master=True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
        )
    except (RuntimeError, OSError) as exc:  # DistNetworkError is a RuntimeError
        raise ConfigError(
            "data_parallel.master_port",
            port,
            f"rank 0 cannot listen on {address}:{port}: {exc}",
            "use 0 (rank 0 picks a free port) or a port nothing else uses",
        ) from exc


def init_ranks(
    rank: int,
    world: int,
    address: str,
    port: int,
    backend: str,
    timeout_s: float,
    *,
    local_rank: int | None = None,
    from_environment: bool = False,
    store: dist.Store | None = None,
) -> None:
    """Joins the trainer's torch.distributed world (one process per rank; with CUDA, device = local rank).
    `from_environment`: a launcher set MASTER_ADDR / MASTER_PORT (and may host the store itself, as torchrun's
    agent does), so the rendezvous is `env://`. Else rank 0 passes its `rank_zero_store` and the other ranks
    connect to it at address:port."""
    backend = resolve_backend(backend, "data_parallel.backend")
    if backend == "nccl":
        torch.cuda.set_device((rank if local_rank is None else local_rank) % torch.cuda.device_count())
    timeout = datetime.timedelta(seconds=timeout_s)
    if from_environment:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout)
        return
    if store is None:
        store = dist.TCPStore(address, port, world, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def exit_with_parent(interval: float = 1.0) -> None:
    """Worker ranks: a daemon thread that ends this process when the rank-0 process that started it is gone."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                log.warning("rank 0 (pid %d) is gone: exiting", parent)
                os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _encode(value: Any) -> Any:
    """Batch keys ride the command bus as tagged JSON objects and come back as `BatchRef`s."""
    if isinstance(value, BatchRef):
        return {"__batch_ref__": value.as_dict()}
    raise TypeError(f"a trainer command cannot carry {type(value).__name__}")


def _decode(obj: dict[str, Any]) -> Any:
    return BatchRef(**obj["__batch_ref__"]) if "__batch_ref__" in obj else obj


class CommandBus:
    """Rank 0 broadcasts commands (JSON objects) to the other ranks, which run them in order.

    Also agrees, before a command touches the model, that every rank is ready (e.g. read its batch):
    `all_ok(ok)` is a collective AND, so one failing rank fails the command on all ranks without a hang.
    """

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        # Workers wait in a broadcast for the next command, possibly for hours between steps.
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=30))

    def send(self, command: dict[str, Any]) -> None:
        if self.rank != 0:
            raise RuntimeError("only rank 0 sends commands")
        self._broadcast(json.dumps(command, default=_encode).encode())

    def _broadcast(self, data: bytes | None) -> bytes:
        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        dist.broadcast(size, src=0, group=self.group)
        buf = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if data is not None
            else torch.empty(int(size), dtype=torch.uint8)
        )
        dist.broadcast(buf, src=0, group=self.group)
        return buf.numpy().tobytes()

    def receive(self) -> dict[str, Any]:
        return json.loads(self._broadcast(None), object_hook=_decode)

    def all_ok(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def serve(self, run: Callable[[dict[str, Any]], Any]) -> None:
        """Worker loop: run every command from rank 0 until the stop command."""
        while True:
            command = self.receive()
            if command.get("op") == STOP:
                return
            try:
                run(command)
            except Exception as exc:  # noqa: BLE001 - rank 0 reports the error; this rank keeps serving
                log.warning("rank %d: command %s failed: %s", self.rank, command.get("op"), exc)

    def stop(self) -> None:
        self.send({"op": STOP})


def require_ok(bus: CommandBus | None, error: BaseException | None, what: str) -> None:
    """Raises `error` (or Unavailable if another rank failed) unless every rank succeeded at `what`."""
    ok = error is None
    if bus is not None and bus.world > 1:
        ok = bus.all_ok(ok)
    if error is not None:
        raise error
    if not ok:
        raise Unavailable(f"another trainer rank failed to {what}; see that rank's log")
