"""TrainerCore: the trainer's models per role (actor, reference, critic) and everything that uses them.

One TrainerCore per trainer process (one rank of a TP x PP x DP layout, `meshrl.trainer.parallel`). Every
rank receives the same global batch (data-plane columns named by `meshrl.common.batch_schema`); each
data-parallel replica works on its share of the rows through Megatron's schedules; results (from TP rank 0 of
the last stage) and gradients are combined over torch.distributed, so any layout gives one process's result.
Has no gRPC imports: `meshrl.trainer.server` converts protos and calls it; tests call it in-process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from meshrl.common import batch_schema as S
from meshrl.common.codec import Ragged
from meshrl.common.errors import MODEL_NOT_LOADED, FailedPrecondition, InvalidArgument, NotFound
from meshrl.common.loss_config import LossConfig
from meshrl.common.roles import ROLES
from meshrl.common.weights import iter_buckets, sample_names, tensor_checksums
from meshrl.trainer import checkpoint as ckpt
from meshrl.trainer import checkpoint_shards as shards
from meshrl.trainer.batching import SequenceBatch, collate, plan_micro_batches, sequence_batch, shard_rows, to_ragged
from meshrl.trainer.call_threads import FORWARD, FORWARD_BACKWARD, call_flop, threads_for
from meshrl.trainer.export import DEFAULT_BUCKET_BYTES
from meshrl.trainer.forward import logprobs_from_logits, values_from_output
from meshrl.trainer.model import ensure_parallel_state
from meshrl.trainer.optim import OptimizerConfig
from meshrl.trainer.reward_model import REWARD_ROLE, load_reward_model
from meshrl.trainer.role_models import build_role
from meshrl.trainer.roles import ComputeResult, NonFiniteLoss, RoleState, TrainResult
from meshrl.trainer.schedule import run_microbatches
from meshrl.trainer.sharding import iter_gathered, local_targets, padded_rows
from meshrl.trainer.training import check_train_inputs, needed_columns, train_role

__all__ = ["ROLES", "ComputeResult", "NonFiniteLoss", "RoleState", "TrainResult", "TrainerCore"]


class TrainerCore:
    """Models per role on this process; see the module docstring."""

    def __init__(
        self,
        *,
        micro_batch_tokens: int = 4096,
        temperature: float = 1.0,
        atomic_steps: bool = True,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        single_thread_below_gflop: float = 0.0,
    ):
        self.layout = ensure_parallel_state(tensor_parallel, pipeline_parallel)
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        self.micro_batch_tokens = micro_batch_tokens
        self.temperature = temperature
        self.atomic_steps = atomic_steps
        self.single_thread_below_gflop = single_thread_below_gflop  # call_threads.py; 0: every call on all threads
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
        if role == REWARD_ROLE:  # a frozen sequence classifier with the critic's head (reward_model.py)
            if copy_from:
                raise InvalidArgument("the reward role loads from its own folder: copy_from is not allowed for it")
            self.roles[role] = load_reward_model(self, path, dtype=dtype, seed=seed)
            return self.roles[role]
        source = self.role(copy_from) if copy_from else None
        state = build_role(
            role,
            path,
            self.layout,
            dtype=dtype,
            optimizer=optimizer,
            seed=seed,
            gradient_checkpointing=gradient_checkpointing,
            source=source,
        )
        self.roles[role] = state
        return state

    def role(self, role: str) -> RoleState:
        if role not in self.roles:
            loaded = ", ".join(self.roles) or "none"
            raise FailedPrecondition(
                f"no model loaded for role {role!r} (loaded: {loaded}); call LoadModel first", reason=MODEL_NOT_LOADED
            )
        return self.roles[role]

    # --- inference ---------------------------------------------------------------------------

    def _plans(self, batch: SequenceBatch, rows, budget: int | None) -> list[list[int]]:
        lengths = batch.total_lengths
        mine = shard_rows(list(rows), lengths, self.layout.dp_rank, self.layout.data_parallel)
        return plan_micro_batches(mine, lengths, budget or self.micro_batch_tokens)

    def threads(self, state: RoleState, batch: SequenceBatch, per_token: int, steps: int = 1):
        """The torch threads of one call over `batch` (call_threads.py): one when this rank's share of the work
        of one of its `steps` optimizer steps (the call's over the ranks and steps) is small."""
        flop = call_flop(state.num_parameters, int(batch.total_lengths.sum()), per_token) / self.world / steps
        return threads_for(flop, self.single_thread_below_gflop, self.device)

    def _gather_rows(self, batch: SequenceBatch, per_row: dict[int, np.ndarray]) -> Ragged:
        """Each replica's result rank computed some rows; sums zero-filled flat buffers so all ranks get every row."""
        if self.world == 1:
            return to_ragged(batch, per_row)
        offsets = batch.responses.offsets
        flat = torch.zeros(int(offsets[-1]), dtype=torch.float32, device=self.device)
        for row, values in per_row.items():
            flat[int(offsets[row]) : int(offsets[row + 1])] = torch.from_numpy(values)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        return Ragged(flat.cpu().numpy(), offsets.astype(np.int64).copy())

    def _run(self, state: RoleState, batch: SequenceBatch, plans: list[list[int]], head):
        """Forward-only schedule over the planned micro-batches; (rows, head extras) on result ranks only."""
        was_training = state.model.training
        state.model.eval()
        try:
            mbs = [collate(batch, rows, self.device) for rows in plans]
            extras = run_microbatches(state.runner, mbs, head, forward_only=True)
        finally:
            state.model.train(was_training)
        return list(zip(plans, extras, strict=True)) if self.layout.holds_results else []

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
        with self.threads(state, batch, FORWARD):
            return self._logprobs(state, batch, temp, with_entropy, micro_batch_tokens)

    @torch.no_grad()
    def _logprobs(
        self, state: RoleState, batch: SequenceBatch, temp: float, with_entropy: bool, budget: int | None
    ) -> ComputeResult:
        """One forward-only pass of `state`'s model over every row of `batch`; every rank gets every row."""
        logps: dict[int, np.ndarray] = {}
        ents: dict[int, np.ndarray] = {}
        plans = self._plans(batch, range(len(batch)), budget)

        def head(logits, mb):
            logp, ent = logprobs_from_logits(
                logits, mb, vocab_size=state.spec.vocab_size, temperature=temp, with_entropy=with_entropy
            )
            return torch.zeros((), device=logits.device), (logp, ent)

        for rows, (logp, ent) in self._run(state, batch, plans, head):
            for i, row in enumerate(rows):
                n = int(batch.response_lengths[row])
                logps[row] = logp[i, :n].cpu().numpy()
                if ent is not None:
                    ents[row] = ent[i, :n].cpu().numpy()
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
        values: dict[int, np.ndarray] = {}
        plans = self._plans(batch, range(len(batch)), micro_batch_tokens)

        def head(out, mb):
            return torch.zeros((), device=out.device), values_from_output(out, mb)

        with self.threads(state, batch, FORWARD):
            for rows, out in self._run(state, batch, plans, head):
                for i, row in enumerate(rows):
                    values[row] = out[i, : int(batch.response_lengths[row])].cpu().numpy()
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
        step_lrs: Sequence[float] = (),
    ) -> TrainResult:
        """`mini_batches` optimizer steps over consecutive row chunks of the batch (grad accumulation over
        micro-batches, global-batch loss normalisation, DP all-reduce, grad clipping, LR schedule).

        Metrics: loss, grad_norm, lr, clip_fraction, dual_clip_fraction, kl, entropy, ratio, tis_weight
        (actor) or vf_loss, vf_clip_fraction, values (critic), tokens, padding_fraction; averaged over steps.
        A NaN/inf loss or gradient raises NonFiniteLoss and leaves model and optimizer as they were.
        lr_override > 0 replaces the scheduled learning rate for this call only. `step_lrs` gives each
        optimizer step its own rate (then mini_batches = len(step_lrs); 1 = the default, or that number).
        """
        state = self.role(role)
        if state.optimizer is None:
            raise FailedPrecondition(f"role {role!r} is frozen (no optimizer); only actor and critic train")
        cfg = loss or LossConfig(policy_loss="value" if role == "critic" else "ppo")
        if (cfg.policy_loss == "value") != (role == "critic"):
            raise InvalidArgument(f"policy_loss {cfg.policy_loss!r} does not fit role {role!r}; critic <-> 'value'")
        batch = sequence_batch(columns, vocab_size=state.spec.vocab_size, needed=needed_columns(cfg))
        mini_batches = check_train_inputs(batch, mini_batches, lr_override, step_lrs)
        temp = self.temperature if temperature is None else temperature
        lrs = list(step_lrs) or [lr_override] * mini_batches
        with self.threads(state, batch, FORWARD_BACKWARD, steps=mini_batches):
            # steps with rates of their own (a warm-up's) are each atomic: no snapshot of the whole call
            return self._train(state, batch, cfg, temp, micro_batch_tokens, lrs, self.atomic_steps and not step_lrs)

    def _train(
        self,
        state: RoleState,
        batch: SequenceBatch,
        cfg: LossConfig,
        temp: float,
        micro_batch_tokens: int | None,
        lrs: list[float],
        atomic: bool,
    ) -> TrainResult:
        """pi_old in the call when the loss asks for it ('in-train'), then the optimizer steps (train_role)."""
        pi_old = None
        if cfg.old_logprobs == "in-train" and cfg.policy_loss not in ("sft", "value"):
            start = time.perf_counter()  # pi_old: the weights as this call finds them, before its first update
            pi_old = batch.token_columns[S.OLD_LOGPROBS] = self._logprobs(
                state, batch, temp, False, micro_batch_tokens
            ).values
            pass_seconds = time.perf_counter() - start
        result = train_role(
            state,
            batch,
            cfg,
            lambda b, rows: self._plans(b, rows, micro_batch_tokens),
            self.device,
            lrs=lrs,
            temperature=temp,
            atomic=atomic,
        )
        if pi_old is not None:
            result.metrics["perf/old_logprob_seconds"] = pass_seconds
            result.old_logprobs = pi_old
        return result

    # --- checkpoints, export ----------------------------------------------------------------------

    def save_checkpoint(self, role: str, path: str, *, step: int, data_state: bytes = b"") -> int:
        """Writes the role's checkpoint atomically, every rank its own shards (`checkpoint_shards`: weight slices,
        optimizer state, also the distributed optimizer's), resumable at any TP / PP / DP. Every rank takes
        part and waits for it. Returns bytes written (rank 0)."""
        state = self.role(role)
        meta = {
            "role": role,
            "step": int(step),
            "train_steps": state.train_steps,
            "weight_version": state.weight_version,
            "model_path": state.model_path,
            "dtype": state.dtype,
            "architecture": state.spec.architecture,
            "layout": shards.layout_meta(self.layout, state),
            "optimizer_config": None if state.optimizer_config is None else state.optimizer_config.model_dump(),
        }
        write = lambda tmp: shards.write_rank_files(tmp, state, self.layout, self.rank)  # noqa: E731
        return ckpt.write_collective(path, self.rank, write, meta, data_state)

    def load_checkpoint(self, role: str, path: str) -> tuple[int, bytes]:
        """Restores model, optimizer, RNG and counters of a loaded role (at this process's layout, whatever the
        layout it was saved at); returns (step, data_state). Every rank verifies the files it reads, and all
        agree, before anything changes."""
        state = self.role(role)
        error = None
        try:
            opened = ckpt.CheckpointDir(path)
            if opened.meta.get("role") != role:
                raise InvalidArgument(f"checkpoint {path!r} holds role {opened.meta.get('role')!r}, not {role!r}")
            reader = shards.ShardReader(opened, state)
            reader.check([p for p, _ in local_targets(state.spec, self.layout, value_head=state.value_head)])
            rng = opened.rng(self.rank)
        except Exception as exc:  # noqa: BLE001 - agreed on by every rank, then re-raised
            error = exc
        ckpt.agree(error, "verify the checkpoint")
        steps = int(opened.meta.get("train_steps", 0))
        shards.restore(reader, state, self.layout, padded_rows(dict(state.model.named_parameters())), steps)
        ckpt.set_rng_state(rng)
        state.train_steps = steps
        state.weight_version = int(opened.meta.get("weight_version", 0))
        return int(opened.meta["step"]), opened.data_state()

    def iter_hf_tensors(self, role: str) -> Iterator[tuple[str, torch.Tensor]]:
        """The role's weights as (HF name, full tensor), gathered over TP and PP: yielded on rank 0 only.
        With model parallelism every rank of data-parallel replica 0 must run this iteration too."""
        state = self.role(role)
        return iter_gathered(state.model, state.spec, self.layout, value_head=state.value_head)

    def checksums(self, role: str, names=None) -> dict[str, str]:
        """{HF name: sha256 hex} over a fixed sample of the role's HF-named tensors (or `names`); rank 0."""
        state = self.role(role)
        known = state.spec_shapes()
        wanted = list(names) if names is not None else sample_names(known)
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise NotFound(
                f"no exported tensor named {unknown[0]!r}; names are HF tensor names like 'model.norm.weight'"
            )
        picked = ((n, t) for n, t in self.iter_hf_tensors(role) if n in set(wanted))
        sums = tensor_checksums(picked, names=wanted) if self.rank == 0 else {}
        for _ in picked:  # other ranks: take part in the whole gather
            pass
        return sums

    def iter_hf_buckets(
        self, role: str, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The role's weights as HF-named tensors in buckets of at most `bucket_bytes` (for publication)."""
        return iter_buckets(self.iter_hf_tensors(role), bucket_bytes)

    def status(self) -> dict[str, object]:
        return {
            "device": str(self.device),
            "data_parallel_size": self.layout.data_parallel,
            "tensor_parallel_size": self.layout.tensor_parallel,
            "pipeline_parallel_size": self.layout.pipeline_parallel,
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
