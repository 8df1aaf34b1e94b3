"""HF weights <-> a GPTModel split by tensor and pipeline parallelism, exactly as Megatron lays it out.

Import: every rank fuses the HF tensors of each parameter it holds (see `hf_weights`) and keeps its slice:
qkv by whole query groups and fc1 as [gate_r; up_r] (column-parallel, dim 0), proj and fc2 on dim 1
(row-parallel), embedding and output layer by (padded) vocabulary, norms whole; a stage holds its own layers
(global layer = stage offset + local index) and, for tied embeddings, the last stage a copy of the embedding.
Export: per parameter, the owning stage's tensor-parallel ranks all-gather it; stage s's TP rank 0 sends it
to global rank 0, which yields the HF tensors one at a time (never the whole model at once). Every rank of
data-parallel replica 0 must iterate `iter_gathered` in the same order; other replicas do nothing.
Called by `meshrl.trainer.core` (load, export, checksums, publication, checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from meshrl.common.errors import InvalidArgument
from meshrl.trainer.hf_config import ModelSpec
from meshrl.trainer.hf_weights import VALUE_HEAD, Mapping, check_hf_tensors, hf_shapes, weight_mappings
from meshrl.trainer.parallel import Layout

COLUMN, ROW, VOCAB, FC1, WHOLE = "column", "row", "vocab", "fc1", "whole"


@dataclass(frozen=True)
class Placed:
    """One Megatron parameter: its HF mapping, the stage holding it, its local name there and its TP split."""

    mapping: Mapping
    stage: int
    local_name: str
    split: str  # COLUMN | ROW | VOCAB | FC1 | WHOLE


def _split_kind(name: str) -> str:
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias")):
        return COLUMN
    if name.endswith("linear_fc1.weight"):
        return FC1
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return ROW
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return VOCAB
    return WHOLE


def placements(spec: ModelSpec, layout: Layout, *, value_head: bool = False) -> list[Placed]:
    """Every parameter of the whole model in HF order, placed on its stage (tied embeddings: the embedding only)."""
    per_stage = spec.num_layers // layout.pipeline_parallel
    last = layout.pipeline_parallel - 1
    out = []
    for m in weight_mappings(spec, value_head=value_head):
        name, stage = m.megatron, 0
        if name.startswith("decoder.layers."):
            index = int(name.split(".")[2])
            stage = index // per_stage
            name = name.replace(f"decoder.layers.{index}.", f"decoder.layers.{index - stage * per_stage}.", 1)
        elif name in ("decoder.final_layernorm.weight", "output_layer.weight"):
            stage = last
        split = WHOLE if m.hf == (VALUE_HEAD,) else _split_kind(name)
        out.append(Placed(m, stage, name, split))
    return out


def _pad_vocab(full: torch.Tensor, rows: int) -> torch.Tensor:
    if full.shape[0] == rows:
        return full
    return torch.cat([full, full.new_zeros(rows - full.shape[0], *full.shape[1:])])


def shard(full: torch.Tensor, split: str, tp: int, rank: int, vocab_rows: int) -> torch.Tensor:
    """This TP rank's slice of a fused full tensor."""
    if split == WHOLE or (tp == 1 and split != VOCAB):
        return full
    if split == VOCAB:
        return _pad_vocab(full, vocab_rows).chunk(tp, dim=0)[rank]
    if split == FC1:
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]])
    return full.chunk(tp, dim=1 if split == ROW else 0)[rank]


def unshard(parts: list[torch.Tensor], split: str, vocab_size: int) -> torch.Tensor:
    """The fused full tensor from every TP rank's slice (inverse of `shard`)."""
    if split == WHOLE:
        return parts[0]
    if split == FC1:
        halves = [p.chunk(2, dim=0) for p in parts]
        return torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    full = torch.cat(parts, dim=1 if split == ROW else 0)
    return full[:vocab_size] if split == VOCAB else full


def local_targets(spec: ModelSpec, layout: Layout, *, value_head: bool = False) -> list[tuple[Placed, str]]:
    """(placement, local parameter name) of every parameter this rank's stage holds; with tied embeddings and
    PP > 1 the last stage's output layer is a copy of the embedding."""
    placed = placements(spec, layout, value_head=value_head)
    out = [(p, p.local_name) for p in placed if p.stage == layout.pp_rank]
    if spec.tie_word_embeddings and not value_head and layout.pipeline_parallel > 1 and layout.last_stage:
        embed = next(p for p in placed if p.local_name == "embedding.word_embeddings.weight")
        out.append((embed, "output_layer.weight"))
    return out


def scatter_full(
    targets: dict[str, torch.Tensor],
    full: Callable[[Placed], torch.Tensor | None],
    spec: ModelSpec,
    layout: Layout,
    vocab_rows: int,
    *,
    value_head: bool = False,
) -> None:
    """Copies this rank's slice of each full fused tensor (`full(placed)`, None = leave as is) into `targets`
    (local name -> tensor). Raises InvalidArgument naming a tensor that does not fit."""
    with torch.no_grad():
        for placed, name in local_targets(spec, layout, value_head=value_head):
            whole = full(placed)
            if whole is None:
                continue
            target = targets.get(name)
            if target is None:
                raise InvalidArgument(f"the built model has no parameter {name!r} (for {placed.mapping.megatron!r})")
            part = shard(whole, placed.split, layout.tensor_parallel, layout.tp_rank, vocab_rows)
            if target.shape != part.shape:
                raise InvalidArgument(
                    f"tensor {placed.mapping.megatron!r} ({list(placed.mapping.hf)}) has shape {tuple(part.shape)} "
                    f"on this rank, the model expects {tuple(target.shape)}"
                )
            target.copy_(part.to(dtype=target.dtype, device=target.device))


def load_sharded(
    model: torch.nn.Module,
    tensors: dict[str, torch.Tensor],
    spec: ModelSpec,
    layout: Layout,
    *,
    value_head: bool = False,
) -> None:
    """Copies this rank's slices of HF-named `tensors` into its part of the model."""
    check_hf_tensors(tensors, spec, value_head=value_head)
    params = dict(model.named_parameters())

    def full(placed: Placed) -> torch.Tensor | None:
        if placed.mapping.hf == (VALUE_HEAD,) and VALUE_HEAD not in tensors:
            return None  # a critic keeps its fresh value head
        return placed.mapping.fuse([tensors[n] for n in placed.mapping.hf])

    scatter_full(params, full, spec, layout, padded_rows(params), value_head=value_head)


def padded_rows(params: dict[str, torch.Tensor]) -> int:
    """The padded vocabulary of the whole model (this rank's shard rows x TP)."""
    tp = ps.get_tensor_model_parallel_world_size()
    for name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        if name in params:
            return params[name].shape[0] * tp
    return 0


def full_shape(m: Mapping, spec: ModelSpec, value_head: bool) -> tuple[int, ...]:
    shapes = hf_shapes(spec)
    if value_head:
        shapes[VALUE_HEAD] = (1, spec.hidden_size)
    return tuple(m.fuse([torch.empty(shapes[n], device="meta") for n in m.hf]).shape)


def iter_full(
    local: dict[str, torch.Tensor], spec: ModelSpec, layout: Layout, *, value_head: bool = False
) -> Iterator[tuple[Placed, torch.Tensor]]:
    """Global rank 0: yields (placement, full fused tensor) of every parameter in HF order, gathered from
    `local` (this rank's tensors by local parameter name: the weights, or an optimizer state shaped like them).
    Other ranks of data-parallel replica 0 take part and yield nothing; other replicas return at once."""
    if layout.dp_rank != 0:
        return
    tp_group = ps.get_tensor_model_parallel_group()
    pp_ranks = dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()) if layout.world > 1 else [0]
    me = dist.get_rank() if dist.is_initialized() else 0
    ref = next(iter(local.values()))
    for placed in placements(spec, layout, value_head=value_head):
        full = None
        if placed.stage == layout.pp_rank:
            mine = local[placed.local_name].detach()
            parts = [mine]
            if layout.tensor_parallel > 1 and placed.split != WHOLE:
                parts = [torch.empty_like(mine) for _ in range(layout.tensor_parallel)]
                dist.all_gather(parts, mine.contiguous(), group=tp_group)
            full = unshard(parts, placed.split, spec.vocab_size)
            if placed.stage != 0 and layout.tp_rank == 0:
                dist.send(full.contiguous(), dst=0)
        elif me == 0:
            full = torch.empty(full_shape(placed.mapping, spec, value_head), dtype=ref.dtype, device=ref.device)
            dist.recv(full, src=pp_ranks[placed.stage])
        if me == 0:
            yield placed, full


def iter_gathered(
    model: torch.nn.Module, spec: ModelSpec, layout: Layout, *, value_head: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Global rank 0: yields (HF name, full tensor) in HF order (see `iter_full`); a single process exports
    locally."""
    for placed, full in iter_full(dict(model.named_parameters()), spec, layout, value_head=value_head):
        yield from zip(placed.mapping.hf, placed.mapping.split(full), strict=True)
