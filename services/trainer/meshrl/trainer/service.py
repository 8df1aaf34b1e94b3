"""TrainerService: the trainer's operations on data-buffer keys, over one or several data-parallel ranks.

Reads input batches from the data buffer, calls `TrainerCore`, writes outputs back (rank 0), publishes
weights. Collective operations are broadcast to the other ranks first (`dp.CommandBus`), so each
public method here is one command. Arguments are plain JSON-able values; `server.py` converts protos
to them. No gRPC imports.
"""

from __future__ import annotations

import base64
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

from meshrl.common import batch_schema as S
from meshrl.common.errors import FailedPrecondition
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.dp import CommandBus, require_ok
from meshrl.trainer.export import count_hf_buckets
from meshrl.trainer.losses import LossConfig
from meshrl.trainer.optim import OptimizerConfig
from meshrl.trainer.publish import DiskPublication, GroupSpec, WeightGroups, publish_to_disk

Key = dict[str, Any]  # {"job_id": str, "step": int, "node_id": str, "shard": int | None}
COLLECTIVE = ("load_model", "compute_logprobs", "compute_values", "train_step", "save_checkpoint", "load_checkpoint")


@dataclasses.dataclass
class Published:
    version: int
    bytes: int
    buckets: int
    seconds: float
    checksums: dict[str, str]
    disk: DiskPublication | None = None


class TrainerService:
    def __init__(self, cfg: TrainerConfig, core: TrainerCore, buffer=None, bus: CommandBus | None = None) -> None:
        self.cfg = cfg
        self.core = core
        self.buffer = buffer  # meshrl.common.databuffer_client.DataBufferClient, or None
        self.bus = bus
        self.groups = WeightGroups()
        self.last_metrics: dict[str, float] = {}
        self._lock = threading.Lock()

    # --- plumbing ---------------------------------------------------------------------------

    def _call(self, op: str, **kwargs: Any) -> Any:
        """Runs a collective op on every rank (rank 0 broadcasts it first); one op at a time."""
        with self._lock:
            if self.bus is not None and self.bus.world > 1:
                self.bus.send({"op": op, "kwargs": kwargs})
            return getattr(self, f"_{op}")(**kwargs)

    def run_command(self, command: dict[str, Any]) -> Any:
        """Worker ranks: execute one command received from rank 0."""
        if command["op"] not in COLLECTIVE:
            raise ValueError(f"unknown trainer command {command['op']!r}")
        return getattr(self, f"_{command['op']}")(**command["kwargs"])

    def _read(self, keys: Sequence[Key]) -> dict[str, object]:
        error, columns = None, {}
        try:
            if self.buffer is None:
                raise FailedPrecondition("the trainer has no data buffer; set databuffer_address in its config")
            from meshrl.common.databuffer_client import batch_key

            protos = [batch_key(k["job_id"], k["step"], k["node_id"], k.get("shard")) for k in keys]
            columns = self.buffer.get_many(protos, wait_seconds=self.cfg.databuffer_wait_seconds).columns
        except Exception as exc:  # noqa: BLE001 - re-raised below after every rank agreed
            error = exc
        require_ok(self.bus, error, "read its input batch")
        return columns

    def _write(self, key: Key, columns: dict[str, object]) -> None:
        if self.core.rank != 0:
            return
        from meshrl.common.databuffer_client import batch_key

        self.buffer.put(batch_key(key["job_id"], key["step"], key["node_id"], key.get("shard")), columns)

    # --- collective operations ----------------------------------------------------------------

    def load_model(self, role: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._call("load_model", role=role, path=path, **kwargs)

    def _load_model(self, role, path, dtype="float32", optimizer=None, seed=0, gradient_checkpointing=False,
                    copy_from=None) -> dict[str, Any]:  # fmt: skip
        opt = OptimizerConfig(**optimizer) if optimizer else None
        state = self.core.load_model(
            role, path, dtype=dtype, optimizer=opt, seed=seed,
            gradient_checkpointing=gradient_checkpointing, copy_from=copy_from,
        )  # fmt: skip
        return {"num_parameters": state.num_parameters, "architecture": state.spec.architecture,
                "vocab_size": state.spec.vocab_size}  # fmt: skip

    def compute_logprobs(self, role: str, inputs: Sequence[Key], output: Key, **kwargs: Any) -> dict[str, Any]:
        return self._call("compute_logprobs", role=role, inputs=list(inputs), output=output, **kwargs)

    def _compute_logprobs(self, role, inputs, output, with_entropy=False, temperature=0.0, micro_batch_tokens=0,
                          output_name="") -> dict[str, Any]:  # fmt: skip
        self.core.role(role)  # fail fast (same on every rank) before waiting for the batch
        columns = self._read(inputs)
        result = self.core.compute_logprobs(
            role,
            columns,
            with_entropy=with_entropy,
            temperature=temperature or self.cfg.defaults.temperature,
            micro_batch_tokens=micro_batch_tokens or self.cfg.defaults.micro_batch_tokens,
        )
        out = {output_name or "logprobs": result.values}
        if result.entropy is not None:
            out[S.ENTROPY] = result.entropy
        self._write(output, out)
        return {"tokens": result.tokens, "micro_batches": result.micro_batches}

    def compute_values(self, inputs: Sequence[Key], output: Key, micro_batch_tokens: int = 0) -> dict[str, Any]:
        return self._call("compute_values", inputs=list(inputs), output=output, micro_batch_tokens=micro_batch_tokens)

    def _compute_values(self, inputs, output, micro_batch_tokens=0) -> dict[str, Any]:
        self.core.role("critic")
        columns = self._read(inputs)
        budget = micro_batch_tokens or self.cfg.defaults.micro_batch_tokens
        result = self.core.compute_values(columns, micro_batch_tokens=budget)
        self._write(output, {S.VALUES: result.values})
        return {"tokens": result.tokens, "micro_batches": result.micro_batches}

    def train_step(self, role: str, inputs: Sequence[Key], loss: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._call("train_step", role=role, inputs=list(inputs), loss=loss, **kwargs)

    def _train_step(self, role, inputs, loss, micro_batch_tokens=0, mini_batches=0, lr_override=0.0) -> dict[str, Any]:
        cfg = LossConfig(**loss)
        self.core.role(role)
        start = time.perf_counter()
        columns = self._read(inputs)
        read = time.perf_counter() - start
        result = self.core.train_step(
            role,
            columns,
            cfg,
            micro_batch_tokens=micro_batch_tokens or self.cfg.defaults.micro_batch_tokens,
            mini_batches=mini_batches or 1,
            lr_override=lr_override,
        )
        result.metrics["perf/read_seconds"] = read
        result.metrics["perf/step_seconds"] = time.perf_counter() - start - read
        self.last_metrics = {f"{role}/{k}": v for k, v in result.metrics.items()}
        return {"metrics": result.metrics, "tokens": result.tokens, "optimizer_steps": result.optimizer_steps}

    def save_checkpoint(self, role: str, path: str, step: int, data_state: bytes = b"") -> int:
        encoded = base64.b64encode(data_state).decode()
        return self._call("save_checkpoint", role=role, path=path, step=step, data_state=encoded)

    def _save_checkpoint(self, role, path, step, data_state="") -> int:
        return self.core.save_checkpoint(role, path, step=step, data_state=base64.b64decode(data_state))

    def load_checkpoint(self, role: str, path: str) -> tuple[int, bytes]:
        return self._call("load_checkpoint", role=role, path=path)

    def _load_checkpoint(self, role, path) -> tuple[int, bytes]:
        return self.core.load_checkpoint(role, path)

    def stop_workers(self) -> None:
        if self.bus is not None and self.bus.world > 1:
            with self._lock:
                self.bus.stop()

    # --- rank 0 only: weights and status ---------------------------------------------------------

    def checksums(self, role: str) -> tuple[int, dict[str, str]]:
        with self._lock:
            return self.core.role(role).weight_version, self.core.checksums(role)

    def join_group(self, spec: GroupSpec) -> int:
        self.groups.join(spec)
        return spec.world_size

    def destroy_group(self, name: str) -> None:
        self.groups.destroy(name)

    def publish(self, role: str, transport: str, version: int, *, disk_root: str = "", keep_last: int = 0,
                bucket_bytes: int = 0, group_name: str = "") -> Published:  # fmt: skip
        """Publishes the role's weights as `version` to disk or over a joined weight group."""
        bucket_bytes = bucket_bytes or self.cfg.defaults.bucket_bytes
        with self._lock:
            state = self.core.role(role)
            start = time.perf_counter()
            sums = self.core.checksums(role)
            buckets = self.core.iter_hf_buckets(role, bucket_bytes)
            if transport == "disk":
                if not disk_root:
                    raise FailedPrecondition("disk publication needs disk_root (the folder of versions)")
                disk = publish_to_disk(
                    buckets, root=disk_root, version=version, model_path=state.model_path,
                    checksums=sums, keep_last=keep_last,
                )  # fmt: skip
                nbytes, count = disk.bytes, disk.buckets
            else:
                group = self.groups.get(group_name)
                count = count_hf_buckets(state.model, state.spec, bucket_bytes, value_head=state.value_head)
                nbytes, disk = group.send(buckets, count, version), None
            state.weight_version = version
            return Published(version, nbytes, count, time.perf_counter() - start, sums, disk)

    def status(self) -> dict[str, Any]:
        return {**self.core.status(), "metrics": dict(self.last_metrics)}
