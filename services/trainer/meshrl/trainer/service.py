"""TrainerService: the trainer's operations on data-buffer keys, over one or several data-parallel ranks.

Reads input batches from the data buffer, calls `TrainerCore`, writes outputs back (rank 0), publishes
weights (`publication.WeightPublisher`). Collective operations are broadcast to the other ranks first
(`dp.CommandBus`), so each public method here is one command. Arguments are plain JSON-able values;
`server.py` converts protos to them. No gRPC imports.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from meshrl.api.common.v1 import weights_pb2
from meshrl.common import batch_schema as S
from meshrl.common.batch_key import BatchRef
from meshrl.common.errors import FailedPrecondition, InvalidArgument
from meshrl.common.loss_config import LossConfig
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.dp import CommandBus, require_ok
from meshrl.trainer.offload import set_residency
from meshrl.trainer.optim_config import OptimizerConfig
from meshrl.trainer.publication import Published, WeightPublisher
from meshrl.trainer.reward_model import REWARD_ROLE, SCORES, compute_scores
from meshrl.trainer.rollout_gap import rollout_gap_metrics

# What one log-prob pass sets for itself; temperature, micro_batch_tokens and the columns read are the call's.
PASS_KEYS = ("with_entropy", "output_name", "weight_version")


def _or_default(value: Any, default: Any) -> Any:
    return default if value is None else value


class TrainerService:
    def __init__(self, cfg: TrainerConfig, core: TrainerCore, buffer=None, bus: CommandBus | None = None) -> None:
        self.cfg = cfg
        self.core = core
        self.buffer = buffer  # meshrl.common.databuffer_client.DataBufferClient, or None
        self.bus = bus
        self.publisher = WeightPublisher(cfg, core, self._start_gather)
        self.last_metrics: dict[str, float] = {}
        self._lock = threading.Lock()
        # The collective operations: rank 0 runs one and sends its name to the other ranks, which run the same.
        self._collective: dict[str, Callable[..., Any]] = {
            "load_model": self._load_model,
            "compute_logprobs": self._compute_logprobs,
            "compute_values": self._compute_values,
            "compute_scores": self._compute_scores,
            "train_step": self._train_step,
            "save_checkpoint": self._save_checkpoint,
            "load_checkpoint": self._load_checkpoint,
            "gather_weights": self._gather_weights,
            "set_residency": self._set_residency,
        }

    # --- plumbing ---------------------------------------------------------------------------

    def _call(self, op: str, **kwargs: Any) -> Any:
        """Runs a collective op on every rank (rank 0 broadcasts it first); one op at a time."""
        with self._lock:
            run = self._collective[op]
            if self.bus is not None and self.bus.world > 1:
                self.bus.send({"op": op, "kwargs": kwargs})
            return run(**kwargs)

    def run_command(self, command: dict[str, Any]) -> Any:
        """Worker ranks: execute one command received from rank 0."""
        run = self._collective.get(command["op"])
        if run is None:
            raise ValueError(f"unknown trainer command {command['op']!r}; known: {sorted(self._collective)}")
        return run(**command["kwargs"])

    def _read(self, keys: Sequence[BatchRef], names: Sequence[str] = ()) -> dict[str, object]:
        """The input batches merged by column; only the columns `names` when given (each from the batch holding it)."""
        error, columns = None, {}
        try:
            if self.buffer is None:
                raise FailedPrecondition("the trainer has no data buffer; set databuffer_address in its config")
            columns = self.buffer.get_many(
                [k.to_proto() for k in keys], columns=list(names), wait_seconds=self.cfg.databuffer_wait_seconds
            ).columns
        except Exception as exc:  # noqa: BLE001 - re-raised below after every rank agreed
            error = exc
        require_ok(self.bus, error, "read its input batch")
        return columns

    def _budget(self, micro_batch_tokens: int | None) -> int:
        """A request's padded tokens per micro-batch, or the trainer's default when it sets none."""
        if micro_batch_tokens is not None and micro_batch_tokens < 1:
            raise InvalidArgument(f"micro_batch_tokens = {micro_batch_tokens} must be at least 1 (or unset)")
        return _or_default(micro_batch_tokens, self.cfg.defaults.micro_batch_tokens)

    def _write(self, key: BatchRef, columns: dict[str, object]) -> None:
        if self.core.rank != 0:
            return
        self.buffer.put(key.to_proto(), columns)

    # --- collective operations ----------------------------------------------------------------

    def check_layout(self, tensor_parallel: int = 0, pipeline_parallel: int = 0, data_parallel: int = 0) -> None:
        """Refuses a requested layout (0 = any) that differs from the one this trainer's ranks were started with."""
        have = self.core.layout
        for name, asked, actual in (
            ("tensor_parallel", tensor_parallel, have.tensor_parallel),
            ("pipeline_parallel", pipeline_parallel, have.pipeline_parallel),
            ("data_parallel", data_parallel, have.data_parallel),
        ):
            if asked and asked != actual:
                raise InvalidArgument(
                    f"parallel.{name} = {asked} was asked, but this trainer runs at {have.describe()}; start the "
                    f"trainer with parallel.{name}={asked} (service config) or leave the request's layout at 0"
                )

    def load_model(self, role: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._call("load_model", role=role, path=path, **kwargs)

    def _load_model(
        self, role, path, dtype="float32", optimizer=None, seed=0, gradient_checkpointing=False, copy_from=None
    ) -> dict[str, Any]:
        opt = OptimizerConfig(**optimizer) if optimizer else None
        state = self.core.load_model(
            role,
            path,
            dtype=dtype,
            optimizer=opt,
            seed=seed,
            gradient_checkpointing=gradient_checkpointing,
            copy_from=copy_from,
        )
        return {
            "num_parameters": state.num_parameters,
            "architecture": state.spec.architecture,
            "vocab_size": state.spec.vocab_size,
        }

    def compute_logprobs(
        self, role: str, inputs: Sequence[BatchRef], output: BatchRef, more_passes: Sequence[dict] = (), **kwargs: Any
    ) -> dict[str, Any]:
        """One log-prob pass over the rows of `inputs`, written to `output`, and each of `more_passes` ({role,
        output, with_entropy, output_name, weight_version}) over the same rows, read once; the reply's
        "passes" holds one reply per further pass, in order."""
        passes = [
            {"role": role, **{k: kwargs.pop(k) for k in PASS_KEYS if k in kwargs}},
            *({k: v for k, v in p.items() if k != "output"} for p in more_passes),
        ]
        outputs = [output, *(p["output"] for p in more_passes)]
        if self.bus is not None and self.bus.world > 1:
            return self._call("compute_logprobs", inputs=list(inputs), outputs=outputs, passes=passes, **kwargs)
        # One rank: only the forward passes hold the lock, so a second call (the reference's beside the
        # actor's) reads its rows while the first computes, and the first writes while the second computes.
        for p in passes:  # fail fast before waiting for the batch
            self.core.role(p["role"])
        columns = self._read(list(inputs), kwargs.pop("columns", ()))
        with self._lock:
            results = [self._logprobs_of(columns, **p, **kwargs) for p in passes]
        return self._write_passes(outputs, results)

    def _compute_logprobs(self, inputs, outputs, passes, columns=(), **kwargs: Any) -> dict[str, Any]:
        """Every rank of a data-parallel trainer, in order with the other collective ops."""
        for p in passes:  # fail fast (same on every rank) before waiting for the batch
            self.core.role(p["role"])
        rows = self._read(inputs, columns)
        return self._write_passes(outputs, [self._logprobs_of(rows, **p, **kwargs) for p in passes])

    def _write_passes(self, outputs: list[BatchRef], results: list[tuple[dict, dict]]) -> dict[str, Any]:
        """Writes each pass's columns to its output; the first pass's reply, with the others' under "passes"."""
        for output, (out, _) in zip(outputs, results, strict=True):
            self._write(output, out)
        replies = [reply for _, reply in results]
        return {**replies[0], "passes": replies[1:]}

    def _logprobs_of(
        self,
        columns,
        role,
        with_entropy=False,
        temperature=None,
        micro_batch_tokens=None,
        output_name="",
        weight_version=None,
    ) -> tuple[dict[str, object], dict[str, Any]]:
        """(the columns to write, the reply) of one log-prob pass of `role` over the rows read (`columns`)."""
        result = self.core.compute_logprobs(
            role,
            columns,
            with_entropy=with_entropy,
            temperature=temperature,
            micro_batch_tokens=self._budget(micro_batch_tokens),
        )
        out = {output_name or "logprobs": result.values}
        metrics: dict[str, float] = {}
        if result.entropy is not None:
            out[S.ENTROPY] = result.entropy
            if result.entropy.values.size:
                metrics["entropy"] = float(result.entropy.values.mean())
        if role == "actor":  # the rollout-vs-actor log-prob gap, from the rows read (rollout_gap.py)
            metrics.update(rollout_gap_metrics(columns, result.values.values, weight_version))
        return out, {"tokens": result.tokens, "micro_batches": result.micro_batches, "metrics": metrics}

    def compute_values(
        self,
        inputs: Sequence[BatchRef],
        output: BatchRef,
        micro_batch_tokens: int | None = None,
        columns: Sequence[str] = (),
    ) -> dict[str, Any]:
        return self._call(
            "compute_values",
            inputs=list(inputs),
            output=output,
            micro_batch_tokens=micro_batch_tokens,
            columns=list(columns),
        )

    def _compute_values(self, inputs, output, micro_batch_tokens=None, columns=()) -> dict[str, Any]:
        self.core.role("critic")
        columns = self._read(inputs, columns)
        result = self.core.compute_values(columns, micro_batch_tokens=self._budget(micro_batch_tokens))
        self._write(output, {S.VALUES: result.values})
        return {"tokens": result.tokens, "micro_batches": result.micro_batches}

    def compute_scores(self, inputs: Sequence[BatchRef], output: BatchRef, **kwargs: Any) -> dict[str, Any]:
        """The reward model's score per row, written to `output` (reward_model.py)."""
        return self._call("compute_scores", inputs=list(inputs), output=output, **kwargs)

    def _compute_scores(self, inputs, output, micro_batch_tokens=None, output_name="", columns=()) -> dict[str, Any]:
        self.core.role(REWARD_ROLE)  # fail fast (same on every rank) before waiting for the batch
        columns = self._read(inputs, columns)
        result = compute_scores(self.core, columns, micro_batch_tokens=self._budget(micro_batch_tokens))
        scores = result.values.values
        self._write(output, {output_name or SCORES: scores})
        metrics = {"score_mean": float(scores.mean()), "score_std": float(scores.std())} if scores.size else {}
        return {"tokens": result.tokens, "micro_batches": result.micro_batches, "metrics": metrics}

    def train_step(self, role: str, inputs: Sequence[BatchRef], loss: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._call("train_step", role=role, inputs=list(inputs), loss=loss, **kwargs)

    def _train_step(
        self,
        role,
        inputs,
        loss,
        micro_batch_tokens=None,
        mini_batches=None,
        lr_override=None,
        columns=(),
        weight_version=None,
        step_lrs=(),
        temperature=None,
    ) -> dict[str, Any]:
        cfg = LossConfig(**loss)
        if mini_batches is not None and mini_batches < 1:
            raise InvalidArgument(f"mini_batches = {mini_batches} must be at least 1 (or unset)")
        self.core.role(role)
        start = time.perf_counter()
        columns = self._read(inputs, columns)
        read = time.perf_counter() - start
        result = self.core.train_step(
            role,
            columns,
            cfg,
            micro_batch_tokens=self._budget(micro_batch_tokens),
            mini_batches=_or_default(mini_batches, 1),
            lr_override=lr_override or 0.0,
            step_lrs=step_lrs,
            temperature=temperature,
        )
        result.metrics["perf/read_seconds"] = read
        result.metrics["perf/step_seconds"] = time.perf_counter() - start - read
        if result.old_logprobs is not None and role == "actor":  # an in-train pi_old pass: the same gap metrics
            result.metrics.update(rollout_gap_metrics(columns, result.old_logprobs.values, weight_version))
        self.last_metrics = {f"{role}/{k}": v for k, v in result.metrics.items()}
        return {
            "metrics": result.metrics,
            "tokens": result.tokens,
            "optimizer_steps": result.optimizer_steps,
            "micro_batches": result.micro_batches,
            "step_losses": result.step_losses,
        }

    def save_checkpoint(self, role: str, path: str, step: int, data_state: bytes = b"") -> int:
        encoded = base64.b64encode(data_state).decode()
        return self._call("save_checkpoint", role=role, path=path, step=step, data_state=encoded)

    def _save_checkpoint(self, role, path, step, data_state="") -> int:
        return self.core.save_checkpoint(role, path, step=step, data_state=base64.b64decode(data_state))

    def load_checkpoint(self, role: str, path: str) -> tuple[int, bytes]:
        return self._call("load_checkpoint", role=role, path=path)

    def _load_checkpoint(self, role, path) -> tuple[int, bytes]:
        return self.core.load_checkpoint(role, path)

    def _gather_weights(self, role: str, passes: int) -> None:
        """Worker ranks: take part in `passes` full gathers of the role's weights (checksums, publication)."""
        for _ in range(passes):
            for _ in self.core.iter_hf_tensors(role):
                pass

    def _start_gather(self, role: str, passes: int) -> None:
        """Rank 0 (holding the lock): with model parallelism, the other ranks must join each weight gather."""
        self.core.role(role)
        if self.bus is not None and self.bus.world > 1 and self.core.layout.model_parallel > 1:
            self.bus.send({"op": "gather_weights", "kwargs": {"role": role, "passes": passes}})

    def stop_workers(self) -> None:
        if self.bus is not None and self.bus.world > 1:
            with self._lock:
                self.bus.stop()

    # --- rank 0 only: weights and status ---------------------------------------------------------

    def checksums(self, role: str) -> tuple[int, dict[str, str]]:
        with self._lock:
            self._start_gather(role, 1)
            return self.core.role(role).weight_version, self.core.checksums(role)

    def join_group(self, group: weights_pb2.CollectiveGroup) -> int:
        return self.publisher.join_group(group)

    def destroy_group(self, name: str) -> None:
        self.publisher.destroy_group(name)

    def publish(self, role: str, transport: str, version: int, **options: Any) -> Published:
        """Publishes the role's weights as `version` (publication.WeightPublisher.publish takes `options`),
        one operation at a time with the collective ones."""
        with self._lock:
            return self.publisher.publish(role, transport, version, **options)

    def status(self) -> dict[str, Any]:
        return {**self.core.status(), "metrics": dict(self.last_metrics)}

    def set_residency(self, resident: bool) -> dict[str, Any]:
        """Colocated mode: offloads (False) or onloads (True) the optimizer state on every rank (offload.py)."""
        return self._call("set_residency", resident=resident)

    def _set_residency(self, resident: bool) -> dict[str, Any]:
        return set_residency(self.core.roles.values(), self.core.device, resident)
