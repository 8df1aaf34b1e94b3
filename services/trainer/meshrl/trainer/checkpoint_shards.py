"""What each trainer rank writes into a checkpoint, and how a trainer at any layout reads it back.

Saving is per rank, nothing is gathered: the model-parallel ranks of data-parallel replica 0 each write their
slice of every parameter they hold (keyed by the parameter's Megatron name in the whole model), and the
optimizer state beside it: whole tensors shaped like the slice with the plain optimizer (replica 0 only), or,
with Megatron's distributed optimizer, every data-parallel rank its own contiguous part of each flattened
slice (the header records each part's [start, end) and the slice's shape). Loading rebuilds, one parameter at
a time, the full fused tensor from the saved slices (parts joined, then TP slices unsharded as in `sharding`)
and keeps this rank's slice, or its owned part under the distributed optimizer: so a checkpoint saved at one
TP x PP x DP layout, with or without the distributed optimizer, resumes at any other. Called by `core`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from meshrl.common.errors import InvalidArgument
from meshrl.trainer import optimizer_state as opt_state
from meshrl.trainer.checkpoint import CheckpointDir, rng_file, rng_state, save_tensors
from meshrl.trainer.parallel import Layout
from meshrl.trainer.roles import RoleState
from meshrl.trainer.sharding import Placed, full_shape, local_targets, placements, shard, unshard


def model_file(tp: int, pp: int) -> str:
    return f"model-tp{tp}-pp{pp}.safetensors"


def optim_file(tp: int, pp: int, dp: int) -> str:
    return f"optim-tp{tp}-pp{pp}-dp{dp}.safetensors"


def layout_meta(layout: Layout, state: RoleState) -> dict[str, int | bool]:
    distributed = state.optimizer is not None and opt_state.is_distributed(state.optimizer)
    return {
        "tensor_parallel": layout.tensor_parallel,
        "pipeline_parallel": layout.pipeline_parallel,
        "data_parallel": layout.data_parallel,
        "distributed_optimizer": distributed,
    }


def write_rank_files(tmp: Path, state: RoleState, layout: Layout, rank: int) -> None:
    """This rank's files: its weight slices (replica 0), optimizer state (replica 0, or every DP rank with the
    distributed optimizer) and RNG states."""
    params = dict(state.model.named_parameters())
    mine = [p for p in placements(state.spec, layout, value_head=state.value_head) if p.stage == layout.pp_rank]
    if layout.dp_rank == 0:
        weights = {p.mapping.megatron: params[p.local_name] for p in mine}
        save_tensors(weights, tmp / model_file(layout.tp_rank, layout.pp_rank))
    distributed = layout_meta(layout, state)["distributed_optimizer"]
    if state.optimizer is not None and (layout.dp_rank == 0 or distributed):
        tensors, parts = {}, {}
        for p in mine:
            local = params[p.local_name]
            flat, states = opt_state.read_state(state.optimizer, local)
            for key, value in states.items():
                name = f"{p.mapping.megatron}/{key}"
                tensors[name] = value
                parts[name] = [*(flat or (0, local.numel())), *local.shape]
        save_tensors(tensors, tmp / optim_file(layout.tp_rank, layout.pp_rank, layout.dp_rank), {"parts": parts})
    save_tensors(rng_state(), tmp / rng_file(rank))


class ShardReader:
    """Full fused tensors (weights, optimizer states) of a checkpoint, read from its per-rank shard files."""

    def __init__(self, opened: CheckpointDir, state: RoleState) -> None:
        saved = opened.meta.get("layout")
        if not isinstance(saved, dict):
            raise InvalidArgument(f"checkpoint {str(opened.root)!r} names no saved layout in meta.json")
        self.opened = opened
        self.spec, self.value_head = state.spec, state.value_head
        self.tp, self.dp = int(saved["tensor_parallel"]), int(saved["data_parallel"])
        self.dp_files = self.dp if saved.get("distributed_optimizer") else 1
        layout = Layout(
            tensor_parallel=self.tp, pipeline_parallel=int(saved["pipeline_parallel"]), data_parallel=self.dp
        )
        self.placed = {p.mapping.megatron: p for p in placements(state.spec, layout, value_head=state.value_head)}
        self._handles: dict[str, object] = {}
        self._parts: dict[str, dict[str, list[int]]] = {}

    def _open(self, name: str):
        if name not in self._handles:
            self._handles[name] = safe_open(self.opened.root / name, framework="pt")
            raw = (self._handles[name].metadata() or {}).get("meshrl")
            self._parts[name] = json.loads(raw)["parts"] if raw else {}
        return self._handles[name]

    def files(self, names: list[str]) -> list[str]:
        """The shard files holding `names` (the saved stages' model files, and their optimizer files if any)."""
        stages = sorted({self.placed[n].stage for n in names if n in self.placed})
        out = [model_file(t, s) for s in stages for t in range(self.tp)]
        optim = [optim_file(t, s, d) for s in stages for t in range(self.tp) for d in range(self.dp_files)]
        return out + [f for f in optim if self.opened.has(f)]

    def check(self, wanted: list[Placed]) -> None:
        """Verifies the files that hold `wanted` and that the checkpoint holds exactly this model's tensors, in
        this model's shapes; raises InvalidArgument / DataLoss naming the first difference. Changes nothing."""
        if set(self.placed) != {
            p.mapping.megatron for p in placements(self.spec, Layout(), value_head=self.value_head)
        }:
            raise InvalidArgument(f"checkpoint {str(self.opened.root)!r} was saved from a different model")
        names = [p.mapping.megatron for p in wanted]
        self.opened.verify(self.files(names))
        for name in names:
            placed = self.placed[name]
            parts = []
            for t in range(self.tp):
                handle = self._open(model_file(t, placed.stage))
                if name not in handle.keys():
                    raise InvalidArgument(f"checkpoint {str(self.opened.root)!r} lacks tensor {name!r}")
                parts.append(torch.empty(handle.get_slice(name).get_shape(), device="meta"))
            have = tuple(unshard(parts, placed.split, self.spec.vocab_size).shape)
            want = full_shape(placed.mapping, self.spec, self.value_head)
            if have != want:
                raise InvalidArgument(f"checkpoint tensor {name!r} has shape {have}, the loaded model {want}")

    def weight(self, name: str) -> torch.Tensor:
        placed = self.placed[name]
        parts = [self._open(model_file(t, placed.stage)).get_tensor(name) for t in range(self.tp)]
        return unshard(parts, placed.split, self.spec.vocab_size)

    def state_keys(self) -> list[str]:
        keys: set[str] = set()
        for stage in sorted({p.stage for p in self.placed.values()}):
            for d in range(self.dp_files):
                if self.opened.has(optim_file(0, stage, d)):
                    keys |= {k.rpartition("/")[2] for k in self._open(optim_file(0, stage, d)).keys()}
        return sorted(keys)

    def state(self, name: str, key: str) -> torch.Tensor | None:
        """The full fused optimizer state `key` of parameter `name`, or None when the checkpoint has none."""
        placed, entry, slices = self.placed[name], f"{name}/{key}", []
        for t in range(self.tp):
            local = None
            for d in range(self.dp_files):
                file = optim_file(t, placed.stage, d)
                if not self.opened.has(file) or entry not in self._open(file).keys():
                    continue
                start, end, *shape = self._parts[file][entry]
                if local is None:
                    local = torch.zeros(shape, dtype=torch.float32).reshape(-1)
                local[start:end] = self._open(file).get_tensor(entry).reshape(-1).to(torch.float32)
            if local is None:
                return None
            slices.append(local.reshape(shape))
        return unshard(slices, placed.split, self.spec.vocab_size)


def restore(reader: ShardReader, state: RoleState, layout: Layout, vocab_rows: int, steps: int) -> None:
    """Copies this rank's slices of the checkpoint's weights and optimizer state into the role (one parameter
    at a time; `reader.check` ran first)."""
    params = dict(state.model.named_parameters())
    targets = local_targets(state.spec, layout, value_head=state.value_head)
    with torch.no_grad():
        for placed, name in targets:
            part = shard(
                reader.weight(placed.mapping.megatron), placed.split, layout.tensor_parallel, layout.tp_rank, vocab_rows
            )
            params[name].copy_(part.to(dtype=params[name].dtype, device=params[name].device))
    if state.optimizer is None:
        return
    for key in reader.state_keys():
        for placed, name in targets:
            full = reader.state(placed.mapping.megatron, key)
            if full is None:
                continue
            part = shard(full, placed.split, layout.tensor_parallel, layout.tp_rank, vocab_rows)
            opt_state.write_state(state.optimizer, params[name], key, part, steps)
