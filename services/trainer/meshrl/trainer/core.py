"""TrainerCore: the trainer's models per role (actor, reference, critic) and everything that uses them.

One TrainerCore per trainer process (data-parallel rank). Every rank receives the same global batch
(data-plane columns named by `meshrl.common.batch_schema`) and works on its share of the rows;
results and gradients are combined over torch.distributed, so N ranks give one rank's result.
Has no gRPC imports: `meshrl.trainer.server` converts protos and calls it; tests call it in-process.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import torch
import torch.distributed as dist

from meshrl.common.codec import Ragged
from meshrl.common.errors import FailedPrecondition, InvalidArgument
from meshrl.common.roles import ROLES
from meshrl.trainer import checkpoint as ckpt
from meshrl.trainer.batching import SequenceBatch, collate, plan_micro_batches, sequence_batch, shard_rows, to_ragged
from meshrl.trainer.export import DEFAULT_BUCKET_BYTES, iter_hf_buckets, weight_checksums
from meshrl.trainer.forward import forward_logprobs, forward_values
from meshrl.trainer.hf_config import read_hf_config
from meshrl.trainer.hf_weights import VALUE_HEAD, iter_hf_tensors, load_hf_tensors, load_hf_weights
from meshrl.trainer.losses import LossConfig
from meshrl.trainer.model import build_gpt_model, ensure_parallel_state, parse_dtype
from meshrl.trainer.optim import OptimizerConfig, build_optimizer
from meshrl.trainer.roles import ComputeResult, NonFiniteLoss, RoleState, TrainResult
from meshrl.trainer.training import needed_columns, train_role

__all__ = ["ROLES", "ComputeResult", "NonFiniteLoss", "RoleState", "TrainResult", "TrainerCore"]


class TrainerCore:
    """Models per role on this process; see the module docstring."""

    def __init__(self, *, micro_batch_tokens: int = 4096, temperature: float = 1.0, atomic_steps: bool = True):
        ensure_parallel_state()
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        self.micro_batch_tokens = micro_batch_tokens
        self.temperature = temperature
        self.atomic_steps = atomic_steps
        self.roles: dict[str, RoleState] = {}

    # --- models ------------------------------------------------------------------------------

    def load_model(
        self,
        role: str,
        path: str,
        *,
        dtype: str = "float32",
        optimizer: OptimizerConfig | None = None,
        seed: int = 0,
        gradient_checkpointing: bool = False,
        copy_from: str | None = None,
    ) -> RoleState:
        """Builds the megatron-core model for `role` from a HF directory (critic: + value head).

        copy_from: take the weights (and model path) of another loaded role instead of the directory's
        safetensors, e.g. a reference that copies the actor after a supervised warm-up; a critic copying an
        actor keeps a fresh value head. actor and critic get an optimizer (default OptimizerConfig when
        None); the reference is frozen. Replaces any model already loaded for the role.
        """
        if role not in ROLES:
            raise InvalidArgument(f"role {role!r} is not one of {ROLES}")
        source = self.role(copy_from) if copy_from else None
        if source is not None:
            path = source.model_path
        spec = source.spec if source is not None else read_hf_config(path)
        model = build_gpt_model(
            spec,
            dtype=parse_dtype(dtype),
            value_head=role == "critic",
            seed=seed,
            gradient_checkpointing=gradient_checkpointing,
        )
        if source is not None:
            tensors = dict(iter_hf_tensors(source.model, source.spec, value_head=source.value_head))
            if role != "critic":
                tensors.pop(VALUE_HEAD, None)
            load_hf_tensors(model, tensors, spec, value_head=role == "critic")
        else:
            load_hf_weights(model, path, spec, value_head=role == "critic")
        state = RoleState(role, str(path), spec, model, dtype)
        state.names = {id(p): n for n, p in model.named_parameters()}
        if role == "reference":
            model.eval().requires_grad_(False)
        else:
            state.optimizer_config = optimizer or OptimizerConfig()
            state.optimizer = build_optimizer(model, state.optimizer_config)
        self.roles[role] = state
        return state

    def role(self, role: str) -> RoleState:
        if role not in self.roles:
            loaded = ", ".join(self.roles) or "none"
            raise FailedPrecondition(f"no model loaded for role {role!r} (loaded: {loaded}); call LoadModel first")
        return self.roles[role]

    # --- inference ---------------------------------------------------------------------------

    def _plans(self, batch: SequenceBatch, rows, budget: int | None) -> list[list[int]]:
        lengths = batch.total_lengths
        mine = shard_rows(list(rows), lengths, self.rank, self.world)
        return plan_micro_batches(mine, lengths, budget or self.micro_batch_tokens)

    def _gather_rows(self, batch: SequenceBatch, per_row: dict[int, np.ndarray]) -> Ragged:
        """Every rank computed some rows; sums zero-filled flat buffers so all ranks get every row."""
        if self.world == 1:
            return to_ragged(batch, per_row)
        offsets = batch.responses.offsets
        flat = torch.zeros(int(offsets[-1]), dtype=torch.float32, device=self.device)
        for row, values in per_row.items():
            flat[int(offsets[row]) : int(offsets[row + 1])] = torch.from_numpy(values)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        return Ragged(flat.cpu().numpy(), offsets.astype(np.int64).copy())

    @torch.no_grad()
    def compute_logprobs(
        self,
        role: str,
        columns: Mapping[str, object],
        *,
        with_entropy: bool = False,
        temperature: float | None = None,
        micro_batch_tokens: int | None = None,
    ) -> ComputeResult:
        """Log-probs (and entropy) of each response token under `role`'s model, as ragged float32."""
        state = self.role(role)
        batch = sequence_batch(columns, vocab_size=state.spec.vocab_size)
        temp = self.temperature if temperature is None else temperature
        if temp <= 0:
            raise InvalidArgument(f"temperature must be positive, got {temp}")
        was_training = state.model.training
        state.model.eval()
        logps: dict[int, np.ndarray] = {}
        ents: dict[int, np.ndarray] = {}
        plans = self._plans(batch, range(len(batch)), micro_batch_tokens)
        try:
            for rows in plans:
                mb = collate(batch, rows, self.device)
                logp, ent = forward_logprobs(state.model, mb, temperature=temp, with_entropy=with_entropy)
                for i, row in enumerate(rows):
                    n = int(batch.response_lengths[row])
                    logps[row] = logp[i, :n].cpu().numpy()
                    if ent is not None:
                        ents[row] = ent[i, :n].cpu().numpy()
        finally:
            state.model.train(was_training)
        return ComputeResult(
            values=self._gather_rows(batch, logps),
            entropy=self._gather_rows(batch, ents) if with_entropy else None,
            tokens=int(batch.response_lengths.sum()),
            micro_batches=len(plans),
        )

    @torch.no_grad()
    def compute_values(self, columns: Mapping[str, object], *, micro_batch_tokens: int | None = None) -> ComputeResult:
        """Critic values per response token (the state before each token), as ragged float32."""
        state = self.role("critic")
        batch = sequence_batch(columns, vocab_size=state.spec.vocab_size)
        was_training = state.model.training
        state.model.eval()
        values: dict[int, np.ndarray] = {}
        plans = self._plans(batch, range(len(batch)), micro_batch_tokens)
        try:
            for rows in plans:
                out = forward_values(state.model, collate(batch, rows, self.device))
                for i, row in enumerate(rows):
                    values[row] = out[i, : int(batch.response_lengths[row])].cpu().numpy()
        finally:
            state.model.train(was_training)
        return ComputeResult(self._gather_rows(batch, values), None, int(batch.response_lengths.sum()), len(plans))

    # --- training ----------------------------------------------------------------------------

    def train_step(
        self,
        role: str,
        columns: Mapping[str, object],
        loss: LossConfig | None = None,
        *,
        micro_batch_tokens: int | None = None,
        mini_batches: int = 1,
        temperature: float | None = None,
        lr_override: float = 0.0,
    ) -> TrainResult:
        """`mini_batches` optimizer steps over consecutive row chunks of the batch (grad accumulation over
        micro-batches, global-batch loss normalisation, DP all-reduce, grad clipping, LR schedule).

        Metrics: loss, grad_norm, lr, clip_fraction, dual_clip_fraction, kl, entropy, ratio, tis_weight
        (actor) or vf_loss, vf_clip_fraction, values (critic), tokens, padding_fraction; averaged over steps.
        A NaN/inf loss or gradient raises NonFiniteLoss and leaves model and optimizer as they were.
        lr_override > 0 replaces the scheduled learning rate for this call only.
        """
        state = self.role(role)
        if state.optimizer is None:
            raise FailedPrecondition(f"role {role!r} is frozen (no optimizer); only actor and critic train")
        cfg = loss or LossConfig(policy_loss="value" if role == "critic" else "ppo")
        if (cfg.policy_loss == "value") != (role == "critic"):
            raise InvalidArgument(f"policy_loss {cfg.policy_loss!r} does not fit role {role!r}; critic <-> 'value'")
        batch = sequence_batch(columns, vocab_size=state.spec.vocab_size, needed=needed_columns(cfg))
        if not 1 <= mini_batches <= len(batch):
            raise InvalidArgument(f"mini_batches = {mini_batches} must be in [1, rows = {len(batch)}]")
        return train_role(
            state,
            batch,
            cfg,
            lambda b, rows: self._plans(b, rows, micro_batch_tokens),
            self.device,
            mini_batches=mini_batches,
            temperature=self.temperature if temperature is None else temperature,
            lr_override=lr_override,
            atomic=self.atomic_steps,
        )

    # --- checkpoints, export ----------------------------------------------------------------------

    def save_checkpoint(self, role: str, path: str, *, step: int, data_state: bytes = b"") -> int:
        """Rank 0 writes the role's checkpoint atomically; every rank waits for it. Returns bytes written."""
        state = self.role(role)
        size = 0
        if self.rank == 0:
            opt_tensors, groups = (None, None)
            if state.optimizer is not None:
                opt_tensors, groups = ckpt.optimizer_tensors(state.optimizer, state.names)
            meta = {
                "role": role,
                "step": int(step),
                "train_steps": state.train_steps,
                "weight_version": state.weight_version,
                "model_path": state.model_path,
                "dtype": state.dtype,
                "architecture": state.spec.architecture,
                "optimizer_groups": groups,
                "optimizer_config": None if state.optimizer_config is None else state.optimizer_config.model_dump(),
            }
            model = dict(state.model.named_parameters())
            size = ckpt.save_checkpoint(path, model=model, optimizer=opt_tensors, meta=meta, data_state=data_state)
        if self.world > 1:
            dist.barrier()
        return size

    def load_checkpoint(self, role: str, path: str) -> tuple[int, bytes]:
        """Restores model, optimizer, RNG and counters of a loaded role; returns (step, data_state).

        Everything is verified before anything changes: a bad checkpoint leaves the role as it was.
        """
        state = self.role(role)
        loaded = ckpt.read_checkpoint(path)
        if loaded.meta.get("role") != role:
            raise InvalidArgument(f"checkpoint {path!r} holds role {loaded.meta.get('role')!r}, not {role!r}")
        params = dict(state.model.named_parameters())
        if set(loaded.model) != set(params):
            diff = sorted(set(loaded.model) ^ set(params))
            raise InvalidArgument(f"checkpoint {path!r} does not match the loaded model: tensor {diff[0]!r} differs")
        for name, tensor in loaded.model.items():
            if tensor.shape != params[name].shape:
                raise InvalidArgument(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, model {tuple(params[name].shape)}"
                )
        with torch.no_grad():
            for name, tensor in loaded.model.items():
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
        if state.optimizer is not None and loaded.optimizer is not None:
            ckpt.restore_optimizer(state.optimizer, params, loaded.optimizer, loaded.meta["optimizer_groups"])
        ckpt.set_rng_state(loaded.rng)
        state.train_steps = int(loaded.meta.get("train_steps", 0))
        state.weight_version = int(loaded.meta.get("weight_version", 0))
        return int(loaded.meta["step"]), loaded.data_state

    def checksums(self, role: str, names=None) -> dict[str, str]:
        """{HF name: sha256 hex} over a fixed sample of the role's HF-named tensors (or `names`)."""
        state = self.role(role)
        return weight_checksums(state.model, state.spec, names, value_head=state.value_head)

    def iter_hf_buckets(
        self, role: str, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The role's weights as HF-named tensors in buckets of at most `bucket_bytes` (for publication)."""
        state = self.role(role)
        return iter_hf_buckets(state.model, state.spec, bucket_bytes, value_head=state.value_head)

    def status(self) -> dict[str, object]:
        return {
            "device": str(self.device),
            "data_parallel_size": self.world,
            "roles": {
                r: {
                    "model_path": s.model_path,
                    "num_parameters": s.num_parameters,
                    "train_steps": s.train_steps,
                    "weight_version": s.weight_version,
                    "architecture": s.spec.architecture,
                    "vocab_size": s.spec.vocab_size,
                }
                for r, s in self.roles.items()
            },
        }
