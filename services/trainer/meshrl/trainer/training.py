"""One train call of a role: mini-batch optimizer steps with gradient accumulation over micro-batches.

Each mini-batch's loss is normalised by its global token / sequence count, so summing micro-batch
gradients (Megatron's schedules and DDP, summed over data-parallel ranks) gives the full-batch gradient;
then grad clipping, the LR schedule and one Megatron optimizer step. A non-finite loss or gradient restores
the state from before the call. Called by `meshrl.trainer.core.TrainerCore.train_step`, which first checks
the call's arguments with `check_train_inputs`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from meshrl.common import batch_schema as S
from meshrl.common.errors import InvalidArgument
from meshrl.common.loss_config import LossConfig
from meshrl.trainer import megatron_compat
from meshrl.trainer.batching import SequenceBatch, collate
from meshrl.trainer.forward import logprobs_from_logits, values_from_output
from meshrl.trainer.losses import interpolated_proximal, loss_denominator, policy_objective, value_objective
from meshrl.trainer.optim import lr_at, set_lr
from meshrl.trainer.roles import NonFiniteLoss, RoleState, TrainResult
from meshrl.trainer.schedule import run_microbatches

PlanFn = Callable[[SequenceBatch, Sequence[int]], list[list[int]]]

_PER_TOKEN_METRICS = {
    "clipped": "clip_fraction",
    "dual_clipped": "dual_clip_fraction",
    "kl": "kl",
    "entropy": "entropy",
    "ratio": "ratio",
    "tis_weight": "tis_weight",
    "is_masked": "is_masked_fraction",
    "vf_clipped": "vf_clip_fraction",
    "values": "values",
}


def needed_columns(cfg: LossConfig) -> list[str]:
    """Per-token columns the objective cannot do without."""
    if cfg.policy_loss == "value":
        return [S.RETURNS]
    needed = [] if cfg.policy_loss == "sft" else [S.ADVANTAGES]
    if cfg.kl_coef:
        needed.append(S.REF_LOGPROBS)
    if (cfg.tis_cap or cfg.mis_cap or cfg.old_logprobs in ("rollout", "interpolated")) and cfg.policy_loss != "sft":
        needed.append(S.ROLLOUT_LOGPROBS)
    if (cfg.old_logprobs == "interpolated" or cfg.lag_lr_scale) and cfg.policy_loss != "sft":
        needed.append(S.RESPONSE_VERSIONS)
    return needed


def lag_step_scale(cfg: LossConfig, batch: SequenceBatch, rows: Sequence[int], weight_version: int) -> float:
    """The factor of one optimizer step's learning rate under lag_lr_scale c: 1 / (1 + c * mean lag of the
    tokens of `rows`), lag = weight_version - the version that generated the token (at least 0); 1 when off."""
    versions = batch.token_columns.get(S.RESPONSE_VERSIONS)
    if not cfg.lag_lr_scale or versions is None or cfg.policy_loss in ("sft", "value"):
        return 1.0
    lags = np.concatenate([np.asarray(versions.row(int(r)), np.float64) for r in rows])
    lag = float(np.clip(weight_version - lags, 0.0, None).mean()) if lags.size else 0.0
    return 1.0 / (1.0 + cfg.lag_lr_scale * lag)


def check_train_inputs(
    batch: SequenceBatch, mini_batches: int, lr_override: float, step_lrs: Sequence[float] = ()
) -> int:
    """Refuses a train call that would change the weights wrongly or count a step that trained nothing; returns
    its number of optimizer steps (one per rate of `step_lrs` when given, else `mini_batches`)."""
    if not math.isfinite(lr_override) or lr_override < 0:
        raise InvalidArgument(
            f"lr_override = {lr_override}: must be a finite number >= 0 (0 = the scheduled learning rate)",
            field="lr_override",
        )
    bad = [lr for lr in step_lrs if not (math.isfinite(lr) and lr > 0)]
    if bad:
        raise InvalidArgument(
            f"step_lrs holds {bad[:3]}: every step's learning rate must be finite and > 0", field="step_lrs"
        )
    if int(batch.response_lengths.sum()) == 0:
        raise InvalidArgument(
            f"the batch's {len(batch)} rows have no response (loss) tokens: nothing to train on; "
            "this call is not a training step. Fix: drop empty responses before the train node",
            field="inputs",
        )
    if step_lrs and mini_batches not in (1, len(step_lrs)):
        raise InvalidArgument(
            f"mini_batches = {mini_batches} but step_lrs holds {len(step_lrs)} rates: one rate per optimizer "
            "step; leave mini_batches unset",
            field="step_lrs",
        )
    mini_batches = len(step_lrs) or mini_batches
    if not 1 <= mini_batches <= len(batch):
        raise InvalidArgument(f"mini_batches = {mini_batches} must be in [1, rows = {len(batch)}]")
    return mini_batches


def train_role(
    state: RoleState,
    batch: SequenceBatch,
    cfg: LossConfig,
    plan: PlanFn,
    device: torch.device,
    *,
    lrs: Sequence[float],
    temperature: float,
    atomic: bool,
) -> TrainResult:
    """One optimizer step per entry of `lrs` (its rate; 0 = the optimizer's schedule) over consecutive row chunks
    of `batch`; metrics averaged over the steps, each step's loss kept. `atomic`: a non-finite step rolls the
    whole call back (a snapshot first); otherwise only that step is undone and the error says how many stay."""
    mini_batches = len(lrs)
    snapshot = _snapshot(state) if atomic and mini_batches > 1 else None
    totals: dict[str, float] = {}
    planned: list[int] = []

    def counted(b: SequenceBatch, rows: Sequence[int]) -> list[list[int]]:
        plans = plan(b, rows)
        planned.append(len(plans))
        return plans

    losses: list[float] = []
    state.model.train()
    for chunk, lr in zip(np.array_split(np.arange(len(batch)), mini_batches), lrs, strict=True):
        try:
            step = _one_step(state, batch, chunk, cfg, counted, device, temperature, lr)
        except NonFiniteLoss as e:
            if snapshot is not None:
                _restore(state, snapshot)
            elif losses:
                raise NonFiniteLoss(
                    f"step {len(losses) + 1} of {mini_batches} in this call failed and was undone; "
                    f"the {len(losses)} steps before it stay applied. {e}"
                ) from e
            raise
        losses.append(step["loss"])
        for k, v in step.items():
            totals[k] = totals.get(k, 0.0) + v / mini_batches
    tokens = int(batch.response_lengths.sum())
    totals["tokens"] = float(tokens)
    return TrainResult(totals, tokens, mini_batches, sum(planned), step_losses=losses)


def _loss_mask(mb) -> torch.Tensor:
    """Tokens that count in the loss: real response tokens, less those a `loss_mask` column zeroes (the
    environment's tokens of a multi-turn trajectory)."""
    extra = mb.columns.get(S.LOSS_MASK)
    return mb.mask if extra is None else mb.mask * extra


def _microbatch_loss(state, output, mb, cfg: LossConfig, denominator: float, temperature: float):
    col = mb.columns.get
    mask = _loss_mask(mb)
    if cfg.policy_loss == "value":
        values = values_from_output(output, mb)
        return value_objective(
            cfg, mask, denominator, values=values, returns=mb.columns[S.RETURNS], old_values=col(S.VALUES)
        )
    logp, ent = logprobs_from_logits(
        output,
        mb,
        vocab_size=state.spec.vocab_size,
        temperature=temperature,
        with_entropy=True,
        entropy_grad=cfg.entropy_coef > 0,
    )
    old = col(S.ROLLOUT_LOGPROBS if cfg.old_logprobs == "rollout" else S.OLD_LOGPROBS)
    if cfg.old_logprobs == "interpolated" and cfg.policy_loss != "sft":  # no pass: from the versions
        old = interpolated_proximal(logp, col(S.ROLLOUT_LOGPROBS), col(S.RESPONSE_VERSIONS), state.weight_version)
    return policy_objective(
        cfg,
        mask,
        denominator,
        logprobs=logp,
        old_logprobs=old,
        advantages=col(S.ADVANTAGES),
        ref_logprobs=col(S.REF_LOGPROBS),
        rollout_logprobs=col(S.ROLLOUT_LOGPROBS),
        entropy=ent,
    )


def _one_step(state, batch, chunk, cfg, plan, device, temperature, lr_override) -> dict[str, float]:
    lengths = batch.response_lengths[chunk]
    mask = (np.arange(max(int(lengths.max()), 1))[None, :] < lengths[:, None]).astype(np.float32)
    if S.LOSS_MASK in batch.token_columns:  # environment tokens of multi-turn trajectories do not count
        loss_mask = batch.token_columns[S.LOSS_MASK]
        for i, row in enumerate(chunk):
            mask[i, : lengths[i]] = loss_mask.row(int(row))
    denominator = loss_denominator(torch.from_numpy(mask), cfg.aggregation)
    plans = plan(batch, chunk.tolist())
    mbs = [collate(batch, rows, device, list(batch.token_columns)) for rows in plans]

    def head(output, mb):
        loss, part = _microbatch_loss(state, output, mb, cfg, denominator, temperature)
        part["loss"] = float(loss.detach())
        return loss, part

    state.ddp.zero_grad_buffer()
    state.optimizer.zero_grad()
    parts = run_microbatches(state.ddp, mbs, head, forward_only=False)
    sums: dict[str, float] = {}
    if state.layout.holds_results:
        for part, rows, mb in zip(parts, plans, mbs, strict=True):
            part["padded_tokens"] = float(mb.num_tokens)
            part["sequence_tokens"] = float(batch.total_lengths[rows].sum())
            for k, v in part.items():
                sums[k] = sums.get(k, 0.0) + v
    sums = _allreduce_sums(sums)
    with megatron_compat.cpu_devices():
        state.optimizer.prepare_grads()
        norm = float(state.optimizer.get_grad_norm())
    if not (np.isfinite(sums.get("loss", 0.0)) and np.isfinite(norm)):
        state.ddp.zero_grad_buffer()
        state.optimizer.zero_grad()
        raise NonFiniteLoss(
            f"train step of role {state.role!r} produced a non-finite loss ({sums.get('loss')}) or grad norm "
            f"({norm}); the model and optimizer were left unchanged. Check the batch's advantages/log-probs "
            "and lower the learning rate"
        )
    lr = lr_override if lr_override > 0 else lr_at(state.optimizer_config, state.train_steps)
    lr *= lag_step_scale(cfg, batch, chunk, state.weight_version)
    set_lr(state.optimizer, lr)
    with megatron_compat.cpu_devices():
        state.optimizer.step()
    state.train_steps += 1
    return _step_metrics(sums, norm, lr)


def _allreduce_sums(sums: dict[str, float]) -> dict[str, float]:
    """Sums the metric sums over all ranks; only one rank per data-parallel replica contributes (the others
    hold no results), so the key sets differ and travel as small objects."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return sums
    gathered: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, sums)
    total: dict[str, float] = {}
    for part in gathered:
        for k, v in part.items():
            total[k] = total.get(k, 0.0) + v
    return total


def _step_metrics(sums: dict[str, float], norm: float, lr: float) -> dict[str, float]:
    tokens = max(sums.get("tokens", 0.0), 1.0)
    out = {"loss": sums.get("loss", 0.0), "grad_norm": norm, "lr": lr}
    out["padding_fraction"] = 1.0 - sums.get("sequence_tokens", 0.0) / max(sums.get("padded_tokens", 1.0), 1.0)
    for key, name in _PER_TOKEN_METRICS.items():
        if key in sums:
            out[name] = sums[key] / tokens
    for key in ("pg_loss", "vf_loss"):
        if key in sums:
            out[key] = sums[key]
    return out


def _torch_optimizers(optimizer) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside a Megatron optimizer; their params are the (fp32 master / sharded) copies."""
    return [inner.optimizer for inner in getattr(optimizer, "chained_optimizers", [optimizer])]


def _snapshot(state: RoleState) -> tuple[dict, list, int]:
    params = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    inner = [
        ([p.detach().clone() for g in t.param_groups for p in g["params"]], copy.deepcopy(t.state_dict()))
        for t in _torch_optimizers(state.optimizer)
    ]
    return params, inner, state.train_steps


def _restore(state: RoleState, snapshot: tuple[dict, list, int]) -> None:
    params, inner, steps = snapshot
    with torch.no_grad():
        for n, p in state.model.named_parameters():
            p.copy_(params[n])
        for t, (mains, optim_state) in zip(_torch_optimizers(state.optimizer), inner, strict=True):
            for p, saved in zip((p for g in t.param_groups for p in g["params"]), mains, strict=True):
                p.copy_(saved)
            t.load_state_dict(optim_state)
    state.train_steps = steps
