"""The learned reward model: a frozen sequence classifier (one label) loaded as the `reward` role, scoring
each sequence once at its last non-pad token, as Hugging Face's *ForSequenceClassification models do.

It reuses the critic's machinery: the same megatron-core GPTModel with a [1, hidden] value head (`score.weight`,
`hf_weights.VALUE_HEAD`), the same loading, sharding and forward-only schedule; only the readout differs (one
position per row instead of one per response token). Called by `TrainerCore.load_model` (role "reward") and
`TrainerService.compute_scores`. No gRPC imports.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from meshrl.common import batch_schema as S
from meshrl.common.codec import Ragged
from meshrl.common.errors import InvalidArgument, NotFound
from meshrl.trainer.batching import SequenceBatch, sequence_batch
from meshrl.trainer.call_threads import FORWARD
from meshrl.trainer.hf_config import ModelSpec, spec_from_config
from meshrl.trainer.hf_weights import VALUE_HEAD, read_hf_tensors
from meshrl.trainer.model import build_gpt_model, parse_dtype
from meshrl.trainer.roles import ComputeResult, RoleState
from meshrl.trainer.sharding import load_sharded

REWARD_ROLE = "reward"
SCORES = S.RM_SCORES  # default name of the column ComputeScores writes: float32 [rows]
_SUFFIX = "ForSequenceClassification"


@dataclasses.dataclass(frozen=True)
class RewardSpec:
    """What a reward model folder declares beyond the decoder: its class and the id HF pools past."""

    model: ModelSpec
    pad_token_id: int | None  # None: every sequence is scored at its last token


def read_reward_config(path: str | Path) -> RewardSpec:
    """Reads `<path>/config.json` of a HF sequence classifier with one label (e.g. Qwen2ForSequenceClassification);
    refuses anything else with the reason and the fix."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise NotFound(
            f"reward model folder {str(path)!r} has no config.json; point config.model_path at a Hugging "
            "Face sequence-classification model folder (config.json + safetensors)"
        )
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise InvalidArgument(f"{file} is not valid JSON: {err}") from None
    arch = (config.get("architectures") or [None])[0]
    if not isinstance(arch, str) or not arch.endswith(_SUFFIX):
        raise InvalidArgument(
            f"reward model {str(path)!r} is a {arch!r}, not a *{_SUFFIX}; a reward model is a "
            "sequence classifier with one label (e.g. Qwen2ForSequenceClassification, num_labels 1)"
        )
    labels = int(config.get("num_labels") or len(config.get("id2label") or {}) or 2)  # HF's default is 2 labels
    if labels != 1:
        raise InvalidArgument(
            f"reward model {str(path)!r} has {labels} labels; a reward model scores with exactly "
            "one (save it with num_labels=1)"
        )
    decoder = spec_from_config({**config, "architectures": [arch[: -len(_SUFFIX)] + "ForCausalLM"]})
    pad = config.get("pad_token_id")
    return RewardSpec(dataclasses.replace(decoder, architecture=arch), None if pad is None else int(pad))


def load_reward_model(core, path: str, *, dtype: str = "float32", seed: int = 0) -> RoleState:
    """Builds the frozen reward role on `core`'s layout from a HF sequence-classifier folder; the folder must
    hold the trained head (`score.weight`): a reward model with a fresh head would score at random."""
    reward = read_reward_config(path)
    tensors = read_hf_tensors(path)
    if VALUE_HEAD not in tensors:
        raise InvalidArgument(
            f"reward model {str(path)!r} holds no {VALUE_HEAD!r} (its classification head); "
            "save the trained sequence classifier, not its base model"
        )
    model = build_gpt_model(reward.model, dtype=parse_dtype(dtype), value_head=True, seed=seed)
    load_sharded(model, tensors, reward.model, core.layout, value_head=True)
    model.eval().requires_grad_(False)
    state = RoleState(REWARD_ROLE, str(path), reward.model, model, dtype, layout=core.layout)
    state.names = {id(p): n for n, p in model.named_parameters()}
    state.pad_token_id = reward.pad_token_id
    return state


def score_positions(batch: SequenceBatch, pad_token_id: int | None) -> np.ndarray:
    """int64 [rows]: per row, the position HF pools at in prompt ++ response: the last token that is not
    `pad_token_id` (position 0 when every token is), or the last token when the model names no pad id."""
    lengths = batch.total_lengths
    out = np.zeros(len(batch), dtype=np.int64)
    for row in range(len(batch)):
        ids = np.concatenate([batch.prompts.row(row), batch.responses.row(row)])
        if pad_token_id is None:
            out[row] = int(lengths[row]) - 1
        else:
            kept = np.flatnonzero(ids != pad_token_id)
            out[row] = int(kept[-1]) if kept.size else 0
    return out


@torch.no_grad()
def compute_scores(core, columns: Mapping[str, object], *, micro_batch_tokens: int | None = None) -> ComputeResult:
    """One float32 score per row (`ComputeResult.values.values`, [rows]; offsets 0..rows) from the reward role."""
    state = core.role(REWARD_ROLE)
    batch = sequence_batch(columns, vocab_size=state.spec.vocab_size)
    positions = score_positions(batch, state.pad_token_id)
    plans = core._plans(batch, range(len(batch)), micro_batch_tokens)

    def head(out: torch.Tensor, mb):
        at = torch.as_tensor(positions[mb.rows], device=out.device)
        return torch.zeros((), device=out.device), out[torch.arange(len(mb.rows), device=out.device), at, 0].float()

    flat = torch.zeros(len(batch), dtype=torch.float32, device=core.device)
    with core.threads(state, batch, FORWARD):
        for rows, scores in core._run(state, batch, plans, head):
            flat[torch.as_tensor(rows, device=core.device)] = scores
    if core.world > 1:  # each data-parallel replica's result rank scored some rows: sum the zero-filled parts
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    return ComputeResult(
        Ragged(flat.cpu().numpy(), np.arange(len(batch) + 1, dtype=np.int64)),
        None,
        int(batch.total_lengths.sum()),
        len(plans),
    )
