"""The KV cache of the sequences being decoded together, as one left-padded batch.

Owned by the continuous batcher (`meshrl.rollout.batcher`) through the transformers model runner.
Each row is one sequence; keys/values of every layer are [B, H_kv, L, D] tensors whose first
columns may be padding (mask 0). Sequences join (`append_rows`, re-padding to a common length)
and leave (`select_rows`, then the all-padding columns on the left are trimmed) between steps.
Positions are per row (RoPE is already applied in the cached keys), so rows of different
lengths decode together exactly as they would alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

# One sequence's cache: per layer (keys, values), each [1, H_kv, L, D].
SeqKV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class KVBatch:
    """Per-layer keys/values [B, H_kv, L, D] and the mask [B, L] (int64, 1 = real token)."""

    cache: DynamicCache
    mask: torch.Tensor

    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> KVBatch:
        return cls(DynamicCache(), torch.zeros(0, 0, dtype=torch.long, device=device))

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def _layers(self) -> list:
        return list(self.cache.layers)

    def append_rows(self, seqs: Sequence[SeqKV], lengths: Sequence[int]) -> None:
        """Adds sequences (each [1, H, len, D] per layer, no padding) as new rows at the bottom.

        Rows that share one cache (the samples of one prompt, from the prefix cache) are padded once and
        repeated by index, so a step's 1,024 samples of 128 prompts cost 128 pads, not 1,024."""
        if not seqs:
            return
        target = max([self.length, *lengths])
        slot: dict[int, int] = {}
        distinct: list[SeqKV] = []
        for seq in seqs:
            if id(seq) not in slot:
                slot[id(seq)] = len(distinct)
                distinct.append(seq)
        index = torch.tensor([slot[id(seq)] for seq in seqs], dtype=torch.long, device=self.mask.device)
        repeat = len(distinct) < len(seqs)
        old_layers = self._layers() if self.rows else []
        new_layers = []
        for layer in range(len(seqs[0])):
            pair = []
            for part in (0, 1):
                block = torch.cat([_left_pad(seq[layer][part], target) for seq in distinct], dim=0)
                block = block.index_select(0, index) if repeat else block
                if old_layers:
                    old = old_layers[layer].keys if part == 0 else old_layers[layer].values
                    block = torch.cat([_left_pad(old, target), block], dim=0)
                pair.append(block)
            new_layers.append(tuple(pair))
        masks = [_left_pad_mask(self.mask, target)] if self.rows else []
        width = torch.arange(target, device=self.mask.device)[None, :]
        starts = target - torch.tensor(list(lengths), dtype=torch.long, device=self.mask.device)[:, None]
        masks.append((width >= starts).to(torch.long))
        self.mask = torch.cat(masks, dim=0)
        self.cache = DynamicCache(ddp_cache_data=new_layers)

    def select_rows(self, keep: Sequence[int]) -> None:
        """Keeps only the rows `keep` (in that order) and trims columns that are padding in every row."""
        if len(keep) == 0:
            self.cache = DynamicCache()
            self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.mask.device)
            return
        if list(keep) != list(range(self.rows)):
            index = torch.tensor(list(keep), dtype=torch.long, device=self.mask.device)
            self.cache.batch_select_indices(index)
            self.mask = self.mask[index]
        real = self.mask.any(dim=0).nonzero()
        start = int(real[0]) if len(real) else self.length
        if start > 0:
            for layer in self._layers():
                layer.keys = layer.keys[:, :, start:, :]
                layer.values = layer.values[:, :, start:, :]
            self.mask = self.mask[:, start:]

    def row_kv(self, row: int) -> SeqKV:
        """One row's cache without its padding (copies), e.g. to re-admit it elsewhere."""
        start = int(self.mask[row].nonzero()[0]) if self.mask[row].any() else self.length
        return [
            (layer.keys[row : row + 1, :, start:, :].clone(), layer.values[row : row + 1, :, start:, :].clone())
            for layer in self._layers()
        ]

    def positions(self) -> torch.Tensor:
        """[B, 1] position of the next token of every row (= its number of real tokens)."""
        return self.mask.sum(dim=1, keepdim=True)

    def step_mask(self) -> torch.Tensor:
        """[B, L + 1]: the mask for a decode step that adds one real token to every row."""
        return torch.cat([self.mask, torch.ones(self.rows, 1, dtype=torch.long, device=self.mask.device)], dim=1)

    def advance(self) -> None:
        """Records the token every row got in the last decode step (the cache grew by one column)."""
        self.mask = self.step_mask()


def _left_pad(t: torch.Tensor, target: int) -> torch.Tensor:
    pad = target - t.shape[2]
    if pad == 0:
        return t
    zeros = torch.zeros(t.shape[0], t.shape[1], pad, t.shape[3], dtype=t.dtype, device=t.device)
    return torch.cat([zeros, t], dim=2)


def _left_pad_mask(mask: torch.Tensor, target: int) -> torch.Tensor:
    pad = target - mask.shape[1]
    if pad == 0:
        return mask
    return torch.cat([torch.zeros(mask.shape[0], pad, dtype=mask.dtype, device=mask.device), mask], dim=1)
