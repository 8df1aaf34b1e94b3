"""Turns a data-plane batch (ragged columns, `batch_schema` names) into padded micro-batches and back.

A sequence is prompt_ids ++ response_ids; per-token columns are aligned with response_ids, so the
value for response token t comes from the model output at sequence position len(prompt) + t - 1.
Micro-batches are length-balanced: rows are sorted by length and packed greedily under a budget of
padded tokens (rows x longest row), so little compute goes to padding. Rows are dealt to
data-parallel ranks by token count. Called by `meshrl.trainer.core`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from meshrl.common import batch_schema as S
from meshrl.common.codec import Ragged
from meshrl.common.errors import InvalidArgument

# Per-token float columns a train step may use, aligned with response tokens.
TOKEN_COLUMNS = (
    S.ADVANTAGES,
    S.RETURNS,
    S.OLD_LOGPROBS,
    S.REF_LOGPROBS,
    S.ROLLOUT_LOGPROBS,
    S.VALUES,
    S.LOSS_MASK,
)


@dataclass
class SequenceBatch:
    """The validated global batch: N rows of prompt/response ids plus per-response-token columns."""

    prompts: Ragged  # int32 token ids per row
    responses: Ragged  # int32 token ids per row
    token_columns: dict[str, Ragged]  # float32, row i has len(responses.row(i)) entries

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def total_lengths(self) -> np.ndarray:
        return self.prompts.lengths() + self.responses.lengths()

    @property
    def response_lengths(self) -> np.ndarray:
        return self.responses.lengths()


def _ragged(columns: Mapping[str, object], name: str) -> Ragged:
    if name not in columns:
        have = ", ".join(sorted(columns)) or "none"
        raise InvalidArgument(f"batch has no column '{name}' (it has: {have}); it must come from an upstream node")
    col = columns[name]
    if not isinstance(col, Ragged):
        raise InvalidArgument(f"column '{name}' must be ragged (values + offsets), got {type(col).__name__}")
    return col


def sequence_batch(columns: Mapping[str, object], *, vocab_size: int, needed: Sequence[str] = ()) -> SequenceBatch:
    """Validates `columns` (prompt_ids, response_ids, and the per-token columns present or `needed`).

    Errors name the column and the first bad row: missing column, a row with an empty prompt, token ids
    outside [0, vocab_size), per-token lengths that differ from the response's, NaN/inf values.
    """
    prompts, responses = _ragged(columns, S.PROMPT_IDS), _ragged(columns, S.RESPONSE_IDS)
    if len(prompts) != len(responses):
        raise InvalidArgument(f"prompt_ids has {len(prompts)} rows but response_ids has {len(responses)}")
    empty = np.flatnonzero(prompts.lengths() == 0)
    if empty.size:
        raise InvalidArgument(f"row {int(empty[0])} has an empty prompt; every sequence needs >= 1 prompt token")
    for name, col in ((S.PROMPT_IDS, prompts), (S.RESPONSE_IDS, responses)):
        if col.values.size and (col.values.min() < 0 or col.values.max() >= vocab_size):
            bad = int(np.flatnonzero((col.values < 0) | (col.values >= vocab_size))[0])
            row = int(np.searchsorted(col.offsets, bad, side="right") - 1)
            raise InvalidArgument(
                f"column '{name}' row {row} holds token id {int(col.values[bad])}, outside the vocabulary [0, {vocab_size})"
            )
    token_columns: dict[str, Ragged] = {}
    for name in dict.fromkeys([*needed, *(c for c in TOKEN_COLUMNS if c in columns)]):
        col = _ragged(columns, name)
        if len(col) != len(responses) or not np.array_equal(col.lengths(), responses.lengths()):
            lengths = col.lengths() if len(col) == len(responses) else None
            row = 0 if lengths is None else int(np.flatnonzero(lengths != responses.lengths())[0])
            raise InvalidArgument(
                f"column '{name}' is not aligned with response_ids (first differing row {row}); "
                "per-token columns need one value per response token"
            )
        values = np.asarray(col.values, dtype=np.float32)
        if not np.isfinite(values).all():
            bad = int(np.flatnonzero(~np.isfinite(values))[0])
            row = int(np.searchsorted(col.offsets, bad, side="right") - 1)
            raise InvalidArgument(f"column '{name}' row {row} holds a non-finite value ({values[bad]})")
        token_columns[name] = Ragged(values, col.offsets)
    return SequenceBatch(prompts, responses, token_columns)


def shard_rows(rows: Sequence[int], lengths: np.ndarray, rank: int, world: int) -> list[int]:
    """This rank's share of `rows`: longest first, each to the rank with the fewest tokens so far."""
    if world == 1:
        return list(rows)
    load = np.zeros(world, dtype=np.int64)
    mine: list[int] = []
    for row in sorted(rows, key=lambda r: (-int(lengths[r]), r)):
        target = int(np.argmin(load))
        load[target] += int(lengths[row])
        if target == rank:
            mine.append(row)
    return sorted(mine)


def plan_micro_batches(rows: Sequence[int], lengths: np.ndarray, token_budget: int) -> list[list[int]]:
    """Length-balanced micro-batches: rows sorted by length, packed while rows x max_len <= token_budget.

    A row longer than the budget forms a micro-batch of its own.
    """
    if token_budget <= 0:
        raise InvalidArgument(f"micro_batch_tokens must be positive, got {token_budget}")
    plans: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for row in sorted(rows, key=lambda r: (-int(lengths[r]), r)):
        n = int(lengths[row])
        if current and max(longest, n) * (len(current) + 1) > token_budget:
            plans.append(current)
            current, longest = [], 0
        current.append(row)
        longest = max(longest, n)
    if current:
        plans.append(current)
    return plans


@dataclass
class MicroBatch:
    """Padded tensors of a few rows. b = rows, L = longest prompt+response, R = longest response."""

    rows: list[int]
    input_ids: torch.Tensor  # int64 [b, L], right-padded with 0
    position_ids: torch.Tensor  # int64 [b, L]
    gather_index: torch.Tensor  # int64 [b, R]: sequence position whose output scores response token t
    response_ids: torch.Tensor  # int64 [b, R]
    mask: torch.Tensor  # float32 [b, R], 1 for real response tokens
    columns: dict[str, torch.Tensor]  # float32 [b, R] per-token columns

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0] * self.input_ids.shape[1])


def collate(batch: SequenceBatch, rows: Sequence[int], device: torch.device, names: Sequence[str] = ()) -> MicroBatch:
    """Pads `rows` of the batch into a MicroBatch on `device` with the per-token columns `names`."""
    b = len(rows)
    p_len = batch.prompts.lengths()[list(rows)]
    r_len = batch.responses.lengths()[list(rows)]
    width = int((p_len + r_len).max())
    r_width = max(int(r_len.max()), 1)
    ids = np.zeros((b, width), dtype=np.int64)
    resp = np.zeros((b, r_width), dtype=np.int64)
    mask = np.zeros((b, r_width), dtype=np.float32)
    gather = np.zeros((b, r_width), dtype=np.int64)
    cols = {n: np.zeros((b, r_width), dtype=np.float32) for n in names}
    for i, row in enumerate(rows):
        p, r = batch.prompts.row(row), batch.responses.row(row)
        ids[i, : len(p)] = p
        ids[i, len(p) : len(p) + len(r)] = r
        resp[i, : len(r)] = r
        mask[i, : len(r)] = 1.0
        gather[i] = np.minimum(len(p) - 1 + np.arange(r_width), width - 1)
        for n in names:
            cols[n][i, : len(r)] = batch.token_columns[n].row(row)
    position = np.broadcast_to(np.arange(width, dtype=np.int64), (b, width)).copy()

    def to(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(device)

    return MicroBatch(
        rows=list(rows),
        input_ids=to(ids),
        position_ids=to(position),
        gather_index=to(gather),
        response_ids=to(resp),
        mask=to(mask),
        columns={n: to(v) for n, v in cols.items()},
    )


def to_ragged(batch: SequenceBatch, per_row: Mapping[int, np.ndarray]) -> Ragged:
    """Reassembles per-row response-aligned arrays (any order) into a float32 Ragged in row order."""
    missing = [r for r in range(len(batch)) if r not in per_row]
    if missing:
        raise InvalidArgument(f"no result for row {missing[0]} of {len(batch)}")
    return Ragged(
        np.concatenate([per_row[r] for r in range(len(batch))]).astype(np.float32)
        if len(batch)
        else np.zeros(0, np.float32),
        batch.responses.offsets.astype(np.int64).copy(),
    )
